"""Control requests (set, pause, resume, stop, tune): parsing, signing, checking; and the events they lead to."""

from __future__ import annotations

import json
import math
import os
import socket
import time
import uuid
from typing import Any

from ddptop.config import SyncConfig
from ddptop.control.auth import BadValue
from ddptop.errors import UsageError
from ddptop.events import TUNABLE
from ddptop.safe import clean

OPS = ("set", "pause", "resume", "stop", "tune")
SETTABLE = {"strategy": str, "bucket_mb": float, "async_op": bool, "batch_size": int, "lr": float, "scale_lr": bool,
            "accum": int, "compress": str, "lr_warmup_steps": int, "shard_unit": str}
MAX_REQUEST_BYTES = 4096
REQUEST_WINDOW_S = 60.0  # a request older (or newer) than this by rank 0's clock is refused: replays die with it


def parse_assignments(items: list[str]) -> dict[str, Any]:
    """`strategy=allreduce async_op=true` → typed changes; unknown keys and bad values are UsageErrors."""
    changes: dict[str, Any] = {}
    for item in items:
        key, sep, text = item.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or key not in SETTABLE:
            raise UsageError(f"cannot set {item!r}: use KEY=VALUE with KEY one of {', '.join(SETTABLE)}")
        changes[key] = _typed(key, text.strip())
        if key != "scale_lr":  # each value's own range, before anything connects (strategy name, batch 1..65536);
            # on allreduce, where every setting means something but PowerSGD, DDP's (the meanings are checked
            # with the whole set)
            SyncConfig(strategy="ddp" if key == "compress" else "allreduce").replace(**{key: changes[key]})
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
    before, after = current.batch_size * current.accum, new.batch_size * new.accum
    if changes.get("scale_lr") and "lr" not in fields and after != before:
        # linear scaling rule: the learning rate follows the global batch size, b·K·N per step
        new = new.replace(lr=current.lr * after / before)
    return new


def check_request(op: str, world_size: int, sweep_segments: int, latest: SyncConfig, what: str = "bucket") -> None:
    """Rank 0's refusals of a valid request, against the job as it runs (`latest`: the config its newest accepted
    request leads to): `set` and `tune` while a profile sweep owns the configuration (pause, resume and stop work);
    `tune` where there is nothing to tune (the front's tuner says when one is already running); `what` is what it
    tunes (events.TUNABLE). For `tune` a sweep comes before the strategy: its `single` would be told `ctl set
    strategy=ddp first`, which the sweep refuses too."""
    if op == "tune" and world_size < 2:
        raise UsageError(f"tune {what} needs 2 ranks or more: with 1 there is nothing to communicate")
    if op in ("set", "tune") and sweep_segments:
        raise UsageError(f"a profile sweep of {sweep_segments} segments owns the configuration until it ends: {op} is "
                         f"refused{' (pause, resume and stop work)' if op == 'set' else ''}")
    if op == "tune":
        tune_refusal(what, latest.strategy)


def tune_refusal(what: str, strategy: str) -> None:
    """UsageError where a tune of `what` has nothing to tune on `strategy`: bucket tunes DDP's buckets (ddp, and
    zero1: DDP's buckets under a sharded optimizer); zero2 and zero3 have none and are tuned by strategy. A
    strategy tune starts from any strategy that synchronizes the ranks."""
    if what not in TUNABLE:
        raise UsageError(f"tune: say what to tune: {' or '.join(TUNABLE)}, not {clean(str(what), 40)!r}")
    if what == "bucket" and strategy in ("zero2", "zero3"):
        raise UsageError(f"tune bucket tunes DDP's buckets; {strategy} has none (FSDP2 shards by unit): "
                         "ddptop ctl tune strategy tries ddp, zero1, zero2 and zero3")
    if what == "bucket" and strategy not in ("ddp", "zero1"):
        raise UsageError(f"tune bucket tunes DDP's buckets; the job runs {strategy} "
                         "(ddptop ctl set strategy=ddp first)")
    if what == "strategy" and strategy == "single":
        raise UsageError("tune strategy compares strategies that synchronize the ranks; the job runs single "
                         "(ddptop ctl set strategy=ddp first)")


def who_am_i(role: str) -> str:
    return f"{role}@{socket.gethostname()}:{os.getpid()}"


def make_request(op: str, changes: dict[str, Any] | None, who: str) -> dict[str, Any]:
    """A request as `ctl` sends it to the front (which gives it its id), with a nonce and a time."""
    if op not in OPS:
        raise UsageError(f"unknown control op {op!r}")
    return {"op": op, "changes": changes or {}, "who": who, "nonce": uuid.uuid4().hex, "t": time.time()}


class Replays:
    """Nonces rank 0 has accepted within the window: a request is accepted once, and only while it is fresh."""

    def __init__(self, window_s: float = REQUEST_WINDOW_S):
        self.window_s = window_s
        self.seen: dict[str, float] = {}

    def check(self, nonce: str, t: float, now: float) -> None:
        self.seen = {n: at for n, at in self.seen.items() if at > now - 2 * self.window_s}
        if abs(now - t) > self.window_s:
            raise ValueError(f"request made {now - t:+.0f} s from rank 0's clock, outside ±{self.window_s:g} s "
                             "(a replay, or clocks that disagree)")
        if nonce in self.seen:
            raise ValueError("request already accepted once (a replay)")
        self.seen[nonce] = now


def read_request(request: Any, replays: Replays, now: float | None = None) -> dict[str, Any]:
    """The request as the front handed it to rank 0, or ValueError saying why it is ignored (size, shape, replay,
    age). Only a `ctl` key can make one (hub.RIGHTS); rank 0 checks it all the same."""
    if not isinstance(request, dict) or len(json.dumps(request)) > MAX_REQUEST_BYTES:
        raise ValueError("malformed request")
    data = request
    if (data.get("op") not in OPS or not isinstance(data.get("changes"), dict) or not isinstance(data.get("who"), str)
            or not isinstance(data.get("nonce"), str) or not _finite(data.get("t"))
            or not isinstance(data.get("id"), int)):
        raise ValueError("malformed request")
    replays.check(data["nonce"], data["t"], time.time() if now is None else now)
    return {**data, "who": clean(data["who"], 120)}


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def decision_blob(job_id: str, request_id: int, config: dict[str, Any], who: str) -> bytes:
    """Rank 0's decision for the process group: JSON naming its job and request. No MAC: the group is the ranks'
    own connection, which carries the pause/stop flags and the gradients as they are; whoever can write into it
    can change those already (README's trust model), so a tag on this one message bought nothing."""
    return json.dumps({"job": job_id, "request": request_id, "config": config, "who": who}).encode()


def read_decision(raw: Any, job_id: str, request_id: int, cap: int) -> dict[str, Any]:
    """{"config", "who"} of a decision for this job and request, or BadValue (ValueError) saying why not."""
    body = load_object(raw, cap)
    if type(body.get("request")) is not int or not isinstance(body.get("config"), dict) \
            or not isinstance(body.get("who"), str):
        raise BadValue("not a decision")
    if body.get("job") != job_id or body["request"] != request_id:
        raise BadValue(f"a decision for another job or request ({clean(body['request'], 20)})")
    return {"config": body["config"], "who": body["who"]}


def load_object(body: Any, cap: int) -> dict[str, Any]:
    """A JSON object of at most `cap` bytes, or BadValue (ValueError) saying why not."""
    if not isinstance(body, (bytes, bytearray, str)) or len(body) > cap:
        raise BadValue(f"not a value of at most {cap} bytes")
    try:
        value = json.loads(body)
    except UnicodeDecodeError:
        raise BadValue("not UTF-8 text") from None
    except (ValueError, RecursionError):
        raise BadValue("not JSON") from None
    if not isinstance(value, dict):
        raise BadValue("not a JSON object")
    return value
