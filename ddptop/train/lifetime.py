"""Provides a local rank's ties to the process that started it: it dies with its parent and carries its rank in
its name. The server CPU ranks fork from dies with the front too (train/server.py)."""

from __future__ import annotations

import os
import signal

PR_SET_PDEATHSIG = 1
PR_SET_NAME = 15


def _prctl(option: int, value) -> bool:
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl(option, value) == 0
    except (OSError, AttributeError):
        return False


def die_with_parent() -> None:
    """A local rank must not outlive a front that was killed (-9): Linux delivers SIGKILL to it then. The server
    forked ranks come from dies with the front the same way, and its ranks with it."""
    if _prctl(PR_SET_PDEATHSIG, signal.SIGKILL) and os.getppid() == 1:  # the parent died before prctl took effect
        os._exit(1)


def name(text: str) -> None:
    """The process's name as `ps`, `top` and psutil show it (a forked rank's command line is its server's)."""
    _prctl(PR_SET_NAME, text.encode()[:15])

