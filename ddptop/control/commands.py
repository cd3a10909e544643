"""Control requests (set, pause, resume, stop): parsing, signing, checking; and the events they lead to."""

from __future__ import annotations

import json
import os
import socket
import time
import uuid
from typing import Any

from ddptop.config import SyncConfig
from ddptop.control.token import mac, verify
from ddptop.errors import UsageError
from ddptop.events import ConfigApplied, ControlRefused, RankLost, RunState  # noqa: F401  (re-exported)

OPS = ("set", "pause", "resume", "stop")
SETTABLE = {"strategy": str, "bucket_mb": float, "async_op": bool, "batch_size": int, "lr": float, "scale_lr": bool}
MAX_REQUEST_BYTES = 4096


def parse_assignments(items: list[str]) -> dict[str, Any]:
    """`strategy=allreduce async_op=true` → typed changes; unknown keys and bad values are UsageErrors."""
    changes: dict[str, Any] = {}
    for item in items:
        key, sep, text = item.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or key not in SETTABLE:
            raise UsageError(f"cannot set {item!r}: use KEY=VALUE with KEY one of {', '.join(SETTABLE)}")
        changes[key] = _typed(key, text.strip())
    if not changes:
        raise UsageError("nothing to set: give KEY=VALUE pairs, e.g. strategy=allreduce")
    return changes


def _typed(key: str, text: str) -> Any:
    kind = SETTABLE[key]
    try:
        if kind is bool:
            value = {"true": True, "1": True, "yes": True, "on": True, "false": False, "0": False, "no": False,
                     "off": False}[text.lower()]
        elif kind is int:
            value = int(text)
        elif kind is float:
            value = float(text)
        else:
            value = text
    except (KeyError, ValueError):
        raise UsageError(f"{key}={text!r}: expected {kind.__name__}") from None
    return value


def apply_changes(current: SyncConfig, changes: dict[str, Any]) -> SyncConfig:
    """The new configuration, checked (types, ranges, names) before any rank sees it."""
    if not isinstance(changes, dict) or not changes:
        raise UsageError("a set request needs at least one change")
    unknown = set(changes) - set(SETTABLE)
    if unknown:
        raise UsageError(f"cannot set {', '.join(sorted(unknown))}")
    fields = {k: v for k, v in changes.items() if k != "scale_lr"}
    for key, value in fields.items():
        kind = SETTABLE[key]
        ok = isinstance(value, kind) and not (kind is not bool and isinstance(value, bool))
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            ok = True
        if not ok:
            raise UsageError(f"{key} must be {kind.__name__}, got {value!r}")
    new = current.changed(fields)
    if changes.get("scale_lr") and "lr" not in fields and new.batch_size != current.batch_size:
        # linear scaling rule: the learning rate follows the global batch size
        new = new.replace(lr=current.lr * new.batch_size / current.batch_size)
    return new


def who_am_i(role: str) -> str:
    return f"{role}@{socket.gethostname()}:{os.getpid()}"


def make_request(token: str, op: str, changes: dict[str, Any] | None, who: str) -> bytes:
    if op not in OPS:
        raise UsageError(f"unknown control op {op!r}")
    body = {"op": op, "changes": changes or {}, "who": who, "nonce": uuid.uuid4().hex, "t": time.time()}
    return json.dumps({**body, "mac": mac(token, body)}).encode()


def read_request(token: str, raw: bytes) -> dict[str, Any]:
    """The request's body, or ValueError saying why it is ignored."""
    if len(raw) > MAX_REQUEST_BYTES:
        raise ValueError(f"request of {len(raw)} bytes is over {MAX_REQUEST_BYTES}")
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        raise ValueError("request is not JSON") from None
    if not isinstance(data, dict):
        raise ValueError("request is not a JSON object")
    signature = data.pop("mac", None)
    if not verify(token, data, signature):
        raise ValueError("bad MAC: wrong token or altered message")
    if data.get("op") not in OPS or not isinstance(data.get("changes"), dict) or not isinstance(data.get("who"), str):
        raise ValueError("malformed request")
    return data
