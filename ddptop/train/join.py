"""The join: every rank says who it is; rank 0 checks that they agree and answers for all.

With a token every rank knows, a rank says it to the job's front over ZeroMQ as the `join` role, whose CURVE key
derives from scrypt(token, per-job salt) (control/transport.py): libzmq's CURVE handshake and the front's ZAP
handler refuse any other key before a byte of its message is read, and the front keeps each rank's first hello
for rank 0 (control/hub.py). Rank 0 learns who joined from those authenticated messages; nothing of the join is in
torch's store, and nothing here signs or checks a MAC. Without a token nothing can be checked: hellos and the
verdict are plain JSON in the store's public keys, the first hello for a rank wins (README's trust model).
"""

from __future__ import annotations

import json
import secrets
import time
from datetime import timedelta
from typing import Any

from ddptop.control import keys
from ddptop.control.auth import JobKeys
from ddptop.control.session import Session, SessionError, SessionRefused, SessionTimeout
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
POLL_S = 0.1  # a rank asks for the verdict this often (1,024 ranks: ~10k small requests a second, at start only)
TOKEN_HINT = "the same --token (or DDPTOP_TOKEN)"


class FrontBoard:
    """The join through the job's front, as the `join` role (every rank here knows the token)."""

    def __init__(self, host: str, port: int, job: JobKeys):
        self.session = Session(host, port, job, "join")
        self.refused = False  # the front refused this rank's key at least once: a wrong token, or not this job's

    def _call(self, op: str, body: dict, deadline: float) -> dict | None:
        """The front's reply, or None when it refused the key or did not answer before `deadline` (retried by the
        caller: the front may still be starting); anything else it says is the join's one line."""
        try:
            return self.session.call(op, body, timeout_s=max(0.1, min(5.0, deadline - time.monotonic())))
        except SessionRefused:
            self.refused = True
            time.sleep(POLL_S)
        except SessionTimeout:
            pass
        except SessionError as exc:
            raise RendezvousError(str(exc)) from None
        return None

    def register(self, hello: dict, deadline: float) -> dict | None:
        reply = self._call("hello", {"hello": hello}, deadline)
        return None if reply is None else _object(reply.get("hello"), "the front's copy of this rank's hello")

    def joined(self, deadline: float) -> set[int] | None:
        reply = self._call("joined", {}, deadline)
        return None if reply is None else {r for r in reply.get("ranks") or [] if type(r) is int}

    def hellos(self, world_size: int, deadline: float) -> list[dict]:
        reply = self._call("joined", {"all": True}, deadline) or {}
        hellos = [_object(h, "a hello") for h in reply.get("hellos") or []]
        if [h.get("rank") for h in hellos] != list(range(world_size)):
            raise RendezvousError("the job's front lost some ranks' hellos: is it still running?")
        return hellos

    def answer(self, verdict: dict, deadline: float) -> None:
        self._call("judge", {"verdict": verdict}, deadline)

    def verdict(self, deadline: float) -> dict | None:
        while time.monotonic() < deadline:
            reply = self._call("verdict", {}, deadline)
            if reply is not None and reply.get("verdict") is not None:
                return _object(reply["verdict"], "the join's verdict")
            time.sleep(POLL_S)
        return None

    def close(self) -> None:
        self.session.close()


class StoreBoard:
    """The join in the store's public keys: a job without a token, where nothing can be checked."""

    refused = False

    def __init__(self, store, world_size: int):
        self.store, self.world_size = store, world_size

    def register(self, hello: dict, deadline: float) -> dict:
        mine = json.dumps(hello, sort_keys=True).encode()
        return _load(self.store.compare_set(keys.join(hello["rank"]), "", mine), f"rank {hello['rank']}'s hello")

    def joined(self, deadline: float) -> set[int]:
        return {r for r in range(self.world_size) if self.store.check([keys.join(r)])}

    def hellos(self, world_size: int, deadline: float) -> list[dict]:
        raws = self.store.multi_get([keys.join(r) for r in range(world_size)])
        return [_load(raw, f"rank {r}'s hello") for r, raw in enumerate(raws)]

    def answer(self, verdict: dict, deadline: float) -> None:
        self.store.set(keys.VERDICT, json.dumps(verdict, sort_keys=True).encode())

    def verdict(self, deadline: float) -> dict | None:
        try:
            self.store.wait([keys.VERDICT], timedelta(seconds=max(0.001, deadline - time.monotonic())))
        except Exception:  # torch's timeout
            return None
        # the nonces of every rank: ~30 bytes each
        return _load(self.store.get(keys.VERDICT), "the join's verdict", keys.MAX_VERDICT_BYTES + 32 * self.world_size)

    def close(self) -> None:
        pass


def _load(raw: bytes, what: str, cap: int = keys.MAX_HELLO_BYTES) -> dict[str, Any]:
    if len(raw) > cap:
        raise RendezvousError(f"{what} is refused: over {cap} bytes")
    try:
        value = json.loads(raw)
    except (ValueError, RecursionError):
        raise RendezvousError(f"{what} is not JSON: not a ddptop peer") from None
    return _object(value, what)


def _object(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise RendezvousError(f"{what} is not a JSON object: not a ddptop peer")
    return value


def join(board, rank: int, world_size: int, hello: dict[str, Any], timeout_s: float, token: bool) -> list[dict]:
    """Register this rank and wait for rank 0's verdict. Returns every rank's hello (rank 0) or [] (others).
    `token`: every rank knows the job's token (the board is the front), for the hints of the one-line errors."""
    hello = {**hello, "nonce": secrets.token_hex(8)}
    deadline = time.monotonic() + timeout_s
    try:
        taken = board.register(hello, deadline)
        while taken is None and time.monotonic() < deadline:
            taken = board.register(hello, deadline)
        if taken is None:
            raise RendezvousError(_unanswered(board, timeout_s))
        if taken.get("nonce") != hello["nonce"]:
            raise RendezvousError(f"rank {rank} is already taken by {clean(taken.get('host'), 80)} "
                                  f"pid {clean(taken.get('pid'), 20)}")
        if rank == 0:
            return _judge(board, world_size, timeout_s, deadline, token)
        verdict = board.verdict(deadline)
    finally:
        board.close()
    if verdict is None:
        raise RendezvousError(_unanswered(board, timeout_s))
    if not verdict.get("ok"):
        raise RendezvousError(clean(verdict.get("error") or "rank 0 refused this job", 300))
    if not isinstance(verdict.get("nonces"), dict):
        raise RendezvousError("the join's verdict is malformed")
    if verdict["nonces"].get(str(rank)) != hello["nonce"]:
        raise RendezvousError("rank 0 accepted another process as this rank")
    if verdict.get("world_size") != world_size:
        raise RendezvousError(f"this rank has world size {world_size}, the job has "
                              f"{clean(verdict.get('world_size'), 20)}")
    return []


def _unanswered(board, timeout_s: float) -> str:
    hint = f", with {TOKEN_HINT}" if isinstance(board, FrontBoard) else ""
    refused = " (its front refused this rank's key)" if board.refused else ""
    return f"rank 0 did not answer the handshake within {timeout_s:g} s{refused}: is it running{hint}?"


def _judge(board, world_size: int, timeout_s: float, deadline: float, token: bool) -> list[dict]:
    while True:
        joined = board.joined(deadline)
        if joined is not None and len(joined) >= world_size:
            break
        if time.monotonic() > deadline:
            ranks = ", ".join(str(r) for r in range(world_size) if r not in (joined or set()))
            hint = f": are they running, with {TOKEN_HINT}?" if token else ""
            error = f"rank(s) {ranks} did not join within {timeout_s:g} s (world size {world_size}){hint}"
            board.answer({"ok": False, "error": error, "world_size": world_size, "nonces": {}}, deadline + 5)
            raise RendezvousError(error)
        time.sleep(POLL_S)
    hellos = board.hellos(world_size, deadline + 5)
    error = mismatch(hellos)
    nonces = {str(r): h.get("nonce") for r, h in enumerate(hellos)}
    board.answer({"ok": error is None, "error": error, "world_size": world_size, "nonces": nonces}, deadline + 5)
    if error:
        raise RendezvousError(error)
    return hellos


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
