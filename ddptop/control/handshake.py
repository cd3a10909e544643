"""The join handshake: every rank registers who it is; rank 0 checks they agree and answers for all.

With a token (typed by the user, or handed by the front to the ranks it started) the handshake runs under
the job's namespace and every hello and the verdict are sealed with the job's control key (auth.stretch of the
token and the job's salt): a stranger on the
port can neither see nor answer it, and a rank without the right token never reaches rank 0's view (both
sides give up after --timeout with one line). Without a token nothing can be checked: the handshake uses
the public keys and the first hello for a rank wins (README's trust model).
"""

from __future__ import annotations

import json
import secrets
import time
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from ddptop.control import keys
from ddptop.control.auth import BadValue, seal, unseal
from ddptop.errors import RendezvousError
from ddptop.safe import clean

# Fields that must be equal on every rank, with how to say it when they are not.
MUST_MATCH = {
    "world_size": "world size",
    "ddptop_version": "ddptop version",
    "protocol": "protocol version",
    "torch_version": "torch version",
    "run_config": "run configuration (model, data set, steps, seed, probes)",
    "params_sha256": "model",
}
PARAMS_SHOWN = 400  # [name, shape] pairs in a hello: ~40 bytes each, well inside MAX_HELLO_BYTES
POLL_S = 0.1


def _load(raw: bytes, what: str, token: bytes, context: str, cap: int) -> dict[str, Any]:
    """A hello or verdict: sealed with the job's control key when there is one; a JSON object in any case."""
    try:
        body = unseal(token, context, raw, cap) if token else raw
        if len(body) > cap:
            raise BadValue(f"over {cap} bytes")
        value = json.loads(body)
    except BadValue as exc:
        raise RendezvousError(f"{what} is refused: {exc}") from None
    except (ValueError, RecursionError):
        raise RendezvousError(f"{what} is not JSON: not a ddptop peer") from None
    if not isinstance(value, dict):
        raise RendezvousError(f"{what} is not a JSON object: not a ddptop peer")
    return value


def _dump(value: dict[str, Any], token: bytes, context: str) -> bytes:
    body = json.dumps(value, sort_keys=True).encode()
    return seal(token, context, body) if token else body


def mismatch(hellos: list[dict[str, Any]]) -> str | None:
    """One line naming the first field on which some rank differs from rank 0, or None."""
    first = hellos[0]
    for field, label in MUST_MATCH.items():
        for hello in hellos[1:]:
            if hello.get(field) != first.get(field):
                theirs, ours = hello.get(field), first.get(field)
                if field == "run_config":
                    return f"rank {hello.get('rank')} was started with another {label} than rank 0"
                if field == "params_sha256":
                    difference = _first_difference(hello.get("params"), first.get("params"))
                    return f"rank {hello.get('rank')} built another model than rank 0: {difference}"
                return f"rank {hello.get('rank')} has {label} {clean(theirs, 80)}, rank 0 has {clean(ours, 80)}"
    return None


def _first_difference(theirs: Any, ours: Any) -> str:
    """The first parameter whose name or shape differs: `[name, shape]` lists, the model's order."""
    theirs, ours = theirs if isinstance(theirs, list) else [], ours if isinstance(ours, list) else []
    for index, (a, b) in enumerate(zip(theirs, ours)):
        if a != b:
            return f"its parameter {index} is {clean(a, 100)}, rank 0's is {clean(b, 100)}"
    if len(theirs) == len(ours):
        return f"its parameters differ after the first {len(ours)}"
    shorter = min(len(theirs), len(ours))
    longer, who = (theirs, "it") if len(theirs) > len(ours) else (ours, "rank 0")
    return f"{who} has more parameters, the first extra one {clean(longer[shorter], 100)}"


def join(store: dist.Store, rank: int, world_size: int, hello: dict[str, Any], timeout_s: float,
         token: bytes = b"") -> list[dict]:
    """Register this rank and wait for rank 0's verdict. Returns every rank's hello (rank 0) or [] (others).

    `token` is the job's control key when every rank knows the token (`store` is then the job's namespace), else
    b"" (the public view)."""
    hello = {**hello, "nonce": secrets.token_hex(8)}
    mine = _dump(hello, token, keys.ctx_hello(rank))
    current = store.compare_set(keys.join(rank), "", mine)
    if current != mine:
        other = _load(current, f"rank {rank}'s hello", token, keys.ctx_hello(rank), keys.MAX_HELLO_BYTES)
        raise RendezvousError(f"rank {rank} is already taken by {clean(other.get('host'), 80)} "
                              f"pid {clean(other.get('pid'), 20)}")
    if rank == 0:
        return _judge(store, world_size, timeout_s, token)
    verdict = _await_verdict(store, timeout_s, token)
    if not verdict.get("ok"):
        raise RendezvousError(clean(verdict.get("error") or "rank 0 refused this job", 300))
    if verdict.get("nonces", {}).get(str(rank)) != hello["nonce"]:
        raise RendezvousError("rank 0 accepted another process as this rank")
    if verdict.get("world_size") != world_size:
        raise RendezvousError(f"this rank has world size {world_size}, the job has "
                              f"{clean(verdict.get('world_size'), 20)}")
    return []


def _await_verdict(store: dist.Store, timeout_s: float, token: bytes) -> dict[str, Any]:
    try:
        store.wait([keys.VERDICT], timedelta(seconds=timeout_s))
    except Exception:
        hint = ", with the same --token (or DDPTOP_TOKEN)" if token else ""
        raise RendezvousError(f"rank 0 did not answer the handshake within {timeout_s:g} s: is it running{hint}?"
                              ) from None
    verdict = _load(store.get(keys.VERDICT), "the handshake verdict", token, keys.CTX_VERDICT, keys.MAX_VERDICT_BYTES)
    if not isinstance(verdict.get("nonces"), dict):
        raise RendezvousError("the handshake verdict is malformed")
    return verdict


def _judge(store: dist.Store, world_size: int, timeout_s: float, token: bytes) -> list[dict]:
    deadline = time.monotonic() + timeout_s
    waiting = [keys.join(r) for r in range(world_size)]
    while True:
        missing = [k for k in waiting if not store.check([k])]
        if not missing:
            break
        if time.monotonic() > deadline:
            ranks = ", ".join(k.split("/")[1] for k in missing)
            hint = ": are they running, with the same --token (or DDPTOP_TOKEN)?" if token else ""
            error = f"rank(s) {ranks} did not join within {timeout_s:g} s (world size {world_size}){hint}"
            _answer(store, token, {"ok": False, "error": error, "world_size": world_size, "nonces": {}})
            raise RendezvousError(error)
        time.sleep(POLL_S)
    hellos = [_load(raw, f"rank {r}'s hello", token, keys.ctx_hello(r), keys.MAX_HELLO_BYTES)
              for r, raw in enumerate(store.multi_get(waiting))]
    error = mismatch(hellos)
    nonces = {str(r): h.get("nonce") for r, h in enumerate(hellos)}
    _answer(store, token, {"ok": error is None, "error": error, "world_size": world_size, "nonces": nonces})
    if error:
        raise RendezvousError(error)
    return hellos


def _answer(store: dist.Store, token: bytes, verdict: dict[str, Any]) -> None:
    store.set(keys.VERDICT, _dump(verdict, token, keys.CTX_VERDICT))
