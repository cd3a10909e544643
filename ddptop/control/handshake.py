"""The join handshake: every rank registers who it is; rank 0 checks they agree and answers for all."""

from __future__ import annotations

import json
import time
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from ddptop.control import keys
from ddptop.control.token import mac, verify
from ddptop.errors import RendezvousError

# Fields that must be equal on every rank, with how to say it when they are not.
MUST_MATCH = {
    "world_size": "world size",
    "ddptop_version": "ddptop version",
    "protocol": "protocol version",
    "torch_version": "torch version",
    "run_config": "run configuration (model, data set, steps, seed, probes)",
}
MAX_HELLO_BYTES = 64 * 1024


def _load(raw: bytes, what: str) -> dict[str, Any]:
    if len(raw) > MAX_HELLO_BYTES:
        raise RendezvousError(f"{what} is over {MAX_HELLO_BYTES} bytes: not a ddptop peer")
    try:
        value = json.loads(raw)
    except ValueError:
        raise RendezvousError(f"{what} is not JSON: not a ddptop peer") from None
    if not isinstance(value, dict):
        raise RendezvousError(f"{what} is not a JSON object: not a ddptop peer")
    return value


def mismatch(hellos: list[dict[str, Any]]) -> str | None:
    """One line naming the first field on which some rank differs from rank 0, or None."""
    first = hellos[0]
    for field, label in MUST_MATCH.items():
        for hello in hellos[1:]:
            if hello.get(field) != first.get(field):
                theirs, ours = hello.get(field), first.get(field)
                if field == "run_config":
                    return f"rank {hello.get('rank')} was started with another {label} than rank 0"
                return f"rank {hello.get('rank')} has {label} {theirs}, rank 0 has {ours}"
    return None


def _proof_payload(hello: dict[str, Any]) -> dict[str, Any]:
    return {"join": hello.get("rank"), "host": hello.get("host"), "pid": hello.get("pid")}


def join(store: dist.Store, rank: int, world_size: int, hello: dict[str, Any], timeout_s: float,
         token: str = "", check_token: bool = False) -> list[dict]:
    """Register this rank and wait for rank 0's verdict. Returns every rank's hello (rank 0) or [] (others).

    A rank that has a token signs its hello with it; rank 0 refuses a wrong or missing signature when
    `check_token` (the token was given by the user, or every rank was started by this machine's front).
    """
    if token:
        hello = {**hello, "token_mac": mac(token, _proof_payload(hello))}
    mine = json.dumps(hello, sort_keys=True)
    current = store.compare_set(keys.join(rank), "", mine)
    if current.decode() != mine:
        other = _load(current, f"rank {rank}'s hello")
        raise RendezvousError(f"rank {rank} is already taken by {other.get('host')} pid {other.get('pid')}")
    if rank == 0:
        return _judge(store, world_size, timeout_s, token if check_token else "")
    try:
        store.wait([keys.VERDICT], timedelta(seconds=timeout_s))
    except Exception:
        raise RendezvousError(f"rank 0 did not answer the handshake within {timeout_s:g} s") from None
    verdict = _load(store.get(keys.VERDICT), "the handshake verdict")
    if not verdict.get("ok"):
        raise RendezvousError(str(verdict.get("error", "rank 0 refused this job")))
    if verdict.get("world_size") != world_size:
        raise RendezvousError(f"this rank has world size {world_size}, the job has {verdict.get('world_size')}")
    return []


def _judge(store: dist.Store, world_size: int, timeout_s: float, token: str) -> list[dict]:
    deadline = time.monotonic() + timeout_s
    waiting = [keys.join(r) for r in range(world_size)]
    while True:
        missing = [k for k in waiting if not store.check([k])]
        if not missing:
            break
        if time.monotonic() > deadline:
            ranks = ", ".join(k.split("/")[1] for k in missing)
            error = f"rank(s) {ranks} did not join within {timeout_s:g} s (world size {world_size})"
            store.set(keys.VERDICT, json.dumps({"ok": False, "error": error}))
            raise RendezvousError(error)
        time.sleep(0.05)
    hellos = [_load(raw, f"rank {r}'s hello") for r, raw in enumerate(store.multi_get(waiting))]
    error = mismatch(hellos)
    if error is None and token:
        wrong = [h.get("rank") for h in hellos[1:] if not verify(token, _proof_payload(h), h.get("token_mac"))]
        if wrong:
            error = (f"rank {wrong[0]} presented a wrong or no job token: give every rank the same --token "
                     "(or DDPTOP_TOKEN)")
    store.set(keys.VERDICT, json.dumps({"ok": error is None, "error": error, "world_size": world_size}))
    if error:
        raise RendezvousError(error)
    return hellos
