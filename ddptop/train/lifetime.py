"""Provides a local rank's ties to the process that started it: it dies with its parent, carries its rank in its
name, and keeps what it inherited out of the garbage collector's passes. The server CPU ranks fork from dies with
the front too (train/server.py)."""

from __future__ import annotations

import contextlib
import gc
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



@contextlib.contextmanager
def imports_frozen():
    """Python's recipe for a process that imports much and then forks (gc.freeze's documentation), its parent's side:
    the cyclic collector off while torch and the rest load (~330k objects that live as long as the process), then
    all of it frozen, out of every later pass, and the collector back as it was. Each full pass over those objects
    took ~0.25 CPU-s, the import ran several, and the one at a front's exit ~1 CPU-s: ~1.4 of a tiny job's ~7 CPU-s.
    A process forked inside the block starts with the collector off: its ranks turn it on (`settle`)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if enabled:
            gc.enable()


def settle() -> None:
    """The recipe's child side, first thing in a rank: what it inherited from its server (or a spawned one imported
    to unpickle its task) frozen, and the collector on, whatever the server had it at."""
    gc.freeze()
    gc.enable()
