"""Provides the blocking control-plane calls the app runs in thread workers; answers come back as messages."""

from __future__ import annotations

import time
from typing import Any, Callable

from ddptop.control.client import ControlClient
from ddptop.errors import DdptopError
from ddptop.tui.messages import ControlUpdate

APPLY_TIMEOUT_S = 60.0
TUNE_TIMEOUT_S = 600.0  # the tune's trials: ~4 segments of ~24 steps, minutes for a 2 s/step VGG-11 on the lab

Post = Callable[[ControlUpdate], Any]


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def send_set(connect: Callable[[], ControlClient], changes: dict, post: Post) -> None:
    """Check, send, then follow the request: pending (accepted at step s) → applied at step k."""
    try:
        client = connect()
        client.check_set(changes)  # the same check rank 0 makes: a bad value never leaves this machine
    except DdptopError as exc:
        post(ControlUpdate("set", "invalid", _one_line(exc)))
        return
    except Exception as exc:  # the store is gone: the job is ending
        post(ControlUpdate("set", "error", f"cannot reach the job: {_one_line(exc)}"))
        return
    try:
        request_id = client.request("set", changes)
        post(ControlUpdate("set", "pending", f"request {request_id} sent: {changes}"))
        answer = client.response(request_id)
        deadline = time.monotonic() + APPLY_TIMEOUT_S
        while answer.get("ok") and answer.get("state") != "applied" and time.monotonic() < deadline:
            post(ControlUpdate("set", "pending", f"pending: rank 0 accepted request {request_id} at step "
                                                 f"{answer.get('step')}; every rank switches at the next boundary"))
            time.sleep(0.1)
            answer = client.response(request_id)
    except Exception as exc:
        post(ControlUpdate("set", "error", _one_line(exc)))
        return
    if not answer.get("ok"):
        post(ControlUpdate("set", "invalid", f"refused by rank 0: {answer.get('error')}"))
    elif answer.get("state") == "applied":
        post(ControlUpdate("set", "applied", f"applied at step {answer['step']} (segment {answer['segment']}) "
                                             "on every rank", answer["segment"]))
    else:
        post(ControlUpdate("set", "error", f"accepted but not applied within {APPLY_TIMEOUT_S:g} s"))


def send_tune(connect: Callable[[], ControlClient], what: str, post: Post) -> None:
    """`tune bucket|strategy`, as `ddptop ctl tune` sends it: the outcome's line, or why it was refused or stopped."""
    trying = "ddp, zero1, zero2 and zero3" if what == "strategy" else "the what-if model's best sizes"
    post(ControlUpdate("tune", "pending", f"tune {what}: asked; trying {trying} …"))
    try:
        answer = connect().tune(TUNE_TIMEOUT_S, what)
    except Exception as exc:
        post(ControlUpdate("tune", "error", _one_line(exc)))
        return
    post(ControlUpdate("tune", "applied", str(answer.get("line", ""))))


def send_op(connect: Callable[[], ControlClient], op: str, post: Post) -> None:
    """pause, resume or stop: send and report rank 0's answer."""
    try:
        client = connect()
        request_id = client.request(op)
        answer = client.response(request_id)
    except Exception as exc:
        post(ControlUpdate(op, "error", f"{op}: {_one_line(exc)}"))
        return
    ok = answer.get("ok")
    said = "accepted" if answer.get("state") != "unchanged" else \
        f"already {'paused' if op == 'pause' else 'running'}, nothing changed"
    post(ControlUpdate(op, "accepted" if ok else "error", f"{op}: {said if ok else answer.get('error')}"))
