"""The rank side of the control plane: rank 0 takes requests, every rank learns them at the same step boundary.

Agreement: at an exchange boundary rank 0 broadcasts four integers (newest accepted request, paused, stop,
and how many boundaries until the next exchange) over a small gloo group, and every rank reads the broadcast
launched at the exchange before. Every rank therefore sees a request at the same boundary k and applies it
before step k, whatever the strategy (even `single`, whose ranks otherwise drift apart) — no step ever mixes
two configurations. Requests accepted during a pause are applied together at its end, as the newest (each
request's config is built on the one before it): one switch, and every client answered "applied", the earlier
ones naming the request that carried them (`merged_into`).

Cadence (issue 42): a broadcast's launch and wait cost ~0.1 ms of the training thread's CPU, 5-7% of a 2-3 ms
step, where a plain `single` loop makes no collective at all. So the ranks exchange about every EXCHANGE_EVERY_S,
not every boundary: rank 0 measures its steps and puts the number of boundaries until the next exchange (1 to
MAX_GAP) in each broadcast, and every rank counts its boundaries down from the number it read. Every rank reads
the same numbers, so every rank exchanges at the same boundaries and the same-step switch holds; while a request,
an answer or a pause is under way the gap is 1. A switch waits at most two gaps longer (~2 × EXCHANGE_EVERY_S),
against the ~IDLE_POLL_S its request already waits for rank 0's sync. The broadcast's cost is counted in its
step's time and `own_s` (ddptop's cost); rank 0's control thread does all the talking to the front, so the
broadcast never waits on the network.

Transport (hub.py): every rank's control thread PUSHes a heartbeat a second (the rank's key, a socket of its
own that holds 4 at most: a heartbeat is a state, the newest wins); rank 0's agent syncs with the front every
IDLE_POLL_S (POLL_S while a request is under way) over a Session (DEALER/ROUTER, the agent's key): its status
and answers up, the requests the front took from `ctl` down. An answer stays here until a sync that carried it
was answered, so none is lost to a front that stalled; a front stopped for any length only delays them.

Trust: only a `ctl` key can make a request (hub.RIGHTS); rank 0 accepts each once, within REQUEST_WINDOW_S
(commands.read_request); what every rank applies comes from rank 0 over the process group, naming the job and
the request id (commands.decision_blob: the group is the ranks' own connection; no MAC, see there).
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Callable

import torch
import torch.distributed as dist
import zmq

from ddptop.config import SyncConfig
from ddptop.control import transport
from ddptop.control.auth import BadValue, JobKeys
from ddptop.control.bus import BEAT
from ddptop.control.commands import Replays, apply_changes, check_request, decision_blob, read_decision, read_request
from ddptop.control.session import Session, SessionError
from ddptop.errors import DdptopError, PeerLost
from ddptop.events import ControlRefused, Event, RunState, TuneAsked

CLOSE_WAIT_S = 2.0  # what close gives the control thread before cutting its client (a link gone quiet)
POLL_S = 0.05  # rank 0 reads requests this often while one is under way: its answer and the next come quickly
IDLE_POLL_S = 0.25  # and this often otherwise: each sync is a CURVE round trip that costs the rank's threads and the
# front CPU per second, so per step on a millisecond step (issue 42: 55 syncs in 3 idle s before); a `ctl` waits
# up to 0.25 s more for its "pending"
BUSY_FOR_S = 5.0  # after a request, an answer or a pause, rank 0 syncs every POLL_S again for this long
STATUS_EVERY_S = 0.5
HEARTBEAT_EVERY_S = 1.0
SYNC_TIMEOUT_S = 2.0  # a sync the front does not answer in this long is sent again on a fresh socket
EXCHANGE_EVERY_S = 0.025  # the ranks exchange the control state about this often (a boundary count, see above)
MAX_GAP = 32  # boundaries between two exchanges at most (a stop or a switch lands within 2 × this many steps)
DECISION_BYTES = 2048  # the decision rank 0 broadcasts, padded (a config is ~150 bytes)


@dataclass(frozen=True)
class Decision:
    request_id: int
    config: SyncConfig
    who: str


@dataclass(frozen=True)
class Boundary:
    """What the training thread does at a step boundary."""

    decision: Decision | None
    stop: bool
    waited_s: float = 0.0  # time spent paused, or waiting for every rank to start (not part of any step)


QUIET = Boundary(None, False)  # a boundary between two exchanges


class Link:
    """A rank's control thread's sockets to the front: heartbeats (PUSH, the rank's key); rank 0 also its
    agent's Session. `ports`: session.read_endpoints's."""

    def __init__(self, host: str, ports: dict, job: JobKeys, rank: int):
        self.beats = transport.client_socket(zmq.PUSH, job, "rank", transport.endpoint(host, ports["tel"]),
                                             SNDHWM=4)
        self.session = Session(host, ports["ctl"], job, "agent", SYNC_TIMEOUT_S) if rank == 0 else None

    def beat(self, rank: int, body: dict) -> None:
        try:
            self.beats.send_multipart([BEAT, str(rank).encode(), json.dumps(body).encode()], zmq.NOBLOCK)
        except zmq.Again:  # the front does not read (stopped): the newest beat goes once it reads again
            pass

    def close(self) -> None:
        self.beats.close(linger=0)
        if self.session is not None:
            self.session.close()


class ControlAgent:
    def __init__(self, rank: int, world_size: int, keys: JobKeys, connect: Callable[[], Link],
                 emit: Callable[[Event], None], check: Callable[[SyncConfig], None], initial: SyncConfig,
                 group=None, sweep_segments: int = 0):
        self.rank = rank
        self.world_size = world_size
        self.keys = keys
        self.emit = emit
        self.check = check  # extra checks rank 0 makes against its data (e.g. a batch larger than a shard)
        self.group = group if group is not None or world_size == 1 else dist.new_group(backend="gloo")
        self._replays = Replays()
        self._outbox: deque[tuple[int, dict]] = deque()  # rank 0: answers the front has not acknowledged yet
        self._status_due = True  # rank 0: the next sync carries the status (a segment started since the last)
        self.step = 0
        self.segment = 0
        self.config = initial  # segment 0's configuration: a sweep's first
        self.sweep_segments = sweep_segments  # a profile sweep owns the configuration: `set`, `tune` refused
        self._applied_id = 0
        self._lock = threading.Lock()
        self._pending: deque[Decision] = deque()  # rank 0: accepted, not yet broadcast
        self._sent: dict[int, Decision] = {}  # rank 0: broadcast, not yet applied
        self._merged: dict[int, list[int]] = {}  # rank 0: applied request -> earlier ones its config carries
        self._sent_id = 0
        self._inflight: tuple | None = None  # the broadcast launched at the previous exchange
        self._quiet = 0  # boundaries left before the next exchange (every rank counts the same ones down)
        self._boundaries = 0  # boundaries so far; rank 0: their count and the time at its last launch
        self._launch_count, self._launched_at = 0, None
        self._start_wait = 0.0
        self._latest = initial  # rank 0: the config the newest accepted request leads to
        self._paused = False
        self._stop_requested = False
        self._was_paused = False
        self._halt = threading.Event()
        self.master_lost = ""  # set by the control thread when it cannot open its sockets
        self._client: Link | None = None  # the control thread's sockets
        self._thread = threading.Thread(target=self._run, args=(connect,), name=f"ddptop-control-{rank}",
                                        daemon=True)
        self._thread.start()

    # -- training thread -------------------------------------------------------------------------------
    def boundary(self, step: int) -> Boundary:
        self.step = step
        if self.master_lost:
            raise PeerLost(f"rank {self.rank}: lost the job's master ({self.master_lost}); stopping")
        self._boundaries += 1
        if self._quiet > 0:  # between two exchanges: every rank passes the same boundaries without one
            self._quiet -= 1
            return QUIET
        waited_from = None
        while True:
            request_id, paused, stop, gap = self._exchange()
            if paused != self._was_paused:
                self._was_paused = bool(paused)
                self.emit(RunState(self.rank, step, bool(paused), time.time()))
            if stop or not paused:
                break
            waited_from = waited_from or time.perf_counter()
            time.sleep(POLL_S)
        self._quiet = max(1, gap) - 1
        decision = None
        if request_id > self._applied_id:
            decision = self._decision(request_id)
            self._applied_id = request_id
        waited = time.perf_counter() - waited_from if waited_from is not None else 0.0
        waited, self._start_wait = waited + self._start_wait, 0.0
        return Boundary(decision, bool(stop), waited)

    def applied(self, decision: Decision, step: int, segment: int, answer: bool = True) -> None:
        """A segment started. `answer=False`: its request is answered later (`answer`), after a trial step."""
        with self._lock:
            self.config, self.segment = decision.config, segment
            if decision.request_id == 0:  # a sweep step or a roll-back: later requests change what it set
                self._latest = decision.config
            self._status_due = True  # a sync carries it with (or before) the answer: "applied" shows the new config
        if answer:
            self.answer(decision.request_id, step, segment)

    def answer(self, request_id: int, step: int, segment: int, error: str = "") -> None:
        """Rank 0 answers a `set` request: applied, or rolled back with the reason (a batch that did not fit)."""
        if self.rank != 0 or request_id <= 0:
            return
        body = ({"ok": False, "state": "rolled back", "error": error} if error else {"ok": True, "state": "applied"})
        for earlier in self._merged.pop(request_id, []):  # their changes went in (or out) with this one
            self._answer(earlier, {**body, "step": step, "segment": segment, "merged_into": request_id})
        self._answer(request_id, {**body, "step": step, "segment": segment})

    def _answer(self, request_id: int, response: dict) -> None:
        self._outbox.append((request_id, response))

    def out_of_memory(self, mine: bool) -> list[int]:
        """The ranks that ran out of memory in a trial step, the same list on every rank: one all-reduce of a
        flag per rank over the control group (the training group may be the one that is short of memory)."""
        if self.group is None:
            return [self.rank] if mine else []
        flags = torch.zeros(self.world_size, dtype=torch.int64)
        flags[self.rank] = int(mine)
        dist.all_reduce(flags, group=self.group)
        return [rank for rank, flag in enumerate(flags.tolist()) if flag]

    def _state(self) -> list[int]:
        """What rank 0 broadcasts: the newest request it hands to the ranks (one new one per broadcast), paused,
        stop, and the boundaries until the exchange after the one that reads this. Other ranks contribute a buffer
        to receive into."""
        if self.rank != 0:
            return [0, 0, 0, 0]
        with self._lock:
            if self._pending:
                decision = self._pending.popleft()
                self._sent[decision.request_id] = decision
                self._sent_id = decision.request_id
            gap = self._gap()
            return [self._sent_id, int(self._paused), int(self._stop_requested), gap]

    def _gap(self) -> int:
        """Rank 0: boundaries until the next exchange, ~EXCHANGE_EVERY_S of steps measured since the last launch;
        1 while something is under way (a request, a pause, a stop) or before a step was measured."""
        now, then, steps, gap = time.perf_counter(), self._launched_at, self._boundaries - self._launch_count, 1
        if then is not None and steps > 0 and not (self._pending or self._sent or self._paused or self._was_paused
                                                    or self._stop_requested):
            gap = max(1, min(MAX_GAP, int(EXCHANGE_EVERY_S * steps / max(now - then, 1e-9))))
        self._launched_at, self._launch_count = now, self._boundaries
        return gap

    def _exchange(self) -> tuple[int, int, int, int]:
        """The state rank 0 broadcast at the exchange before, and the next broadcast launched (async_op).

        Pipelined so that no rank waits here for a slower one: by the time a rank reaches this exchange, the
        broadcast launched at the one before has long completed on every rank that took part in the steps
        between (under `single`, ranks may drift up to a gap apart). The cost is a launch, and a switch lands
        one exchange later than a blocking broadcast would apply it."""
        if self.group is None:  # one rank: nothing to agree on, every boundary reads the state (no gap)
            return (*self._state()[:3], 1)
        first = self._inflight is None
        if first:  # the first boundary: every rank starts here together
            self._inflight = self._launch()
        handle, flags = self._inflight
        began = time.perf_counter()
        handle.wait()
        if first:  # waiting for the last rank to start is not ddptop's cost: set aside like a pause
            self._start_wait = time.perf_counter() - began
            self._launched_at = None  # no step measured yet: the next gap is 1
        self._inflight = self._launch()
        return tuple(int(x) for x in flags.tolist())

    def _launch(self) -> tuple:
        flags = torch.tensor(self._state(), dtype=torch.int64)
        return dist.broadcast(flags, src=0, group=self.group, async_op=True), flags

    def _decision(self, request_id: int) -> Decision:
        """Rank 0's decision for `request_id`, broadcast to every rank and checked there (never read from the store)."""
        buffer = torch.zeros(DECISION_BYTES, dtype=torch.uint8)
        mine = self._take_sent(request_id) if self.rank == 0 else None
        if mine is not None:
            blob = decision_blob(self.keys.job_id, request_id, mine.config.to_dict(), mine.who)
            buffer[:4] = torch.tensor(list(len(blob).to_bytes(4, "big")), dtype=torch.uint8)
            buffer[4:4 + len(blob)] = torch.tensor(list(blob), dtype=torch.uint8)
        if self.group is not None:
            dist.broadcast(buffer, src=0, group=self.group)
        if self.rank == 0:
            return mine
        raw = bytes(buffer.tolist())
        try:
            size = int.from_bytes(raw[:4], "big")
            body = read_decision(raw[4:4 + min(size, DECISION_BYTES - 4)], self.keys.job_id, request_id,
                                 DECISION_BYTES)
            return Decision(request_id, SyncConfig(**body["config"]), str(body["who"]))
        except (BadValue, DdptopError, KeyError, TypeError) as exc:  # only a corrupted process group gets here
            raise PeerLost(f"rank {self.rank}: rank 0's decision for request {request_id} is refused ({exc}); "
                           "stopping rather than run another configuration than the other ranks") from None

    def _take_sent(self, request_id: int) -> Decision:
        """Rank 0: the decision for `request_id`. Older ones still sent but not applied were handed out while
        paused (the pause loop reads only the newest broadcast): this one's config carries their changes."""
        with self._lock:
            earlier = sorted(i for i in self._sent if i < request_id)
            for i in earlier:
                del self._sent[i]
            if earlier:
                self._merged[request_id] = earlier
            return self._sent.pop(request_id)

    def close(self) -> None:
        self._halt.set()
        self._thread.join(timeout=CLOSE_WAIT_S)
        self._thread.join(timeout=SYNC_TIMEOUT_S + 1)  # a sync in flight times out within that
        if self.group is not None:
            if self._inflight is not None:
                try:  # every rank launched the same broadcasts: the last one completes unless a peer is gone
                    self._inflight[0].wait()
                except Exception:
                    pass
            dist.destroy_process_group(self.group)

    # -- control thread ---------------------------------------------------------------------------------
    def _run(self, connect: Callable[[], Link]) -> None:
        try:
            link = self._client = connect()
        except DdptopError as exc:
            self.master_lost = str(exc)
            return
        next_beat = next_status = busy_until = 0.0
        beats = seen = 0
        wait = POLL_S
        try:
            while not self._halt.wait(wait):
                now = time.monotonic()
                if now >= next_beat:
                    beats += 1
                    link.beat(self.rank, {"step": self.step, "beat": beats, "paused": self._was_paused})
                    next_beat = now + HEARTBEAT_EVERY_S
                if self.rank != 0:  # only the heartbeat to send: wake for it, not 20 times a second
                    wait = max(0.0, next_beat - time.monotonic())
                    continue
                if now >= next_status:
                    self._status_due, next_status = True, now + STATUS_EVERY_S
                before = seen
                seen = self._sync(link.session, seen)
                if seen != before or self._busy():
                    busy_until = now + BUSY_FOR_S
                wait = POLL_S if now < busy_until else IDLE_POLL_S
            if self.rank == 0 and self._outbox:  # the last answers (a stop's) before the rank leaves
                self._sync(link.session, seen)
        finally:
            link.close()

    def _busy(self) -> bool:
        """Rank 0 has something under way: answers not yet acknowledged, a request not yet applied, a pause."""
        return bool(self._outbox or self._pending or self._sent or self._paused or self._was_paused)

    def _sync(self, session: Session, seen: int) -> int:
        """One exchange with the front: answers and (when due) the status up, new requests down. A sync that
        fails is sent again, whole, next time: nothing is lost to a front that stalled."""
        answers = list(self._outbox)  # before the status: the status is never older than an answer it carries
        body: dict = {"seen": seen, "answers": answers}
        due = self._status_due
        if due:
            with self._lock:
                body["status"] = self._status()
        try:
            reply = session.call("sync", body)
        except SessionError:
            return seen
        for _ in answers:
            self._outbox.popleft()
        if due:
            self._status_due = False
        requests = reply.get("requests")
        for request in requests if isinstance(requests, list) else []:
            request_id = request.get("id") if isinstance(request, dict) else None
            if isinstance(request_id, int) and request_id > seen:
                seen = request_id
                self._take(request_id, request)
        return seen

    def _status(self) -> dict:
        # handed_out: the newest request rank 0 has broadcast to the ranks; while paused, the ones handed out by the
        # resume apply together at its first step (a client that waits for that reads it here)
        return {"step": self.step, "segment": self.segment, "config": self.config.to_dict(),
                "paused": self._was_paused, "world_size": self.world_size, "t": time.time(),
                "job": self.keys.job_id, "handed_out": self._sent_id}

    def _refuse(self, request_id: int, reason: str) -> None:
        self.emit(ControlRefused(request_id, reason, time.time()))

    def _take(self, request_id: int, raw: dict) -> None:
        """Answer a request, then act on it: a `set` queued before its "pending" answer was written could be applied
        and answered "applied" by the training thread first, and "pending" then overwrote "applied" (under load
        `ctl` waited out its 30 s)."""
        then = None
        try:
            request = read_request(raw, self._replays)
            response, then = self._accept(request_id, request)
        except (ValueError, DdptopError) as exc:
            reason = str(exc)
            self._refuse(request_id, reason)
            response = {"ok": False, "error": reason}
        self._answer(request_id, response)
        if then is not None:
            then()

    def _accept(self, request_id: int, request: dict) -> tuple[dict, Callable[[], None] | None]:
        """The answer to a valid request and what follows it once the answer is written (None: nothing)."""
        op = request["op"]
        with self._lock:
            what = request["changes"].get("what", "bucket") if op == "tune" else ""  # older ctls asked for buckets
            check_request(op, self.world_size, self.sweep_segments, self._latest, what)
            if op in ("pause", "resume"):  # rank 0's own flag decides, not a status written up to 0.5 s ago
                if self._paused == (op == "pause"):
                    return {"ok": True, "state": "unchanged", "step": self.step}, None
                self._paused = op == "pause"
            elif op == "stop":
                self._stop_requested = True
            if op == "tune":
                return {"ok": True, "state": "pending", "step": self.step}, lambda: self.emit(
                    TuneAsked(self.rank, request_id, request["who"], time.time(), what))
            if op != "set":
                return {"ok": True, "state": "accepted"}, None
            config = apply_changes(self._latest, request["changes"])
            self.check(config)
            self._latest = config
        decision = Decision(request_id, config, request["who"])
        return {"ok": True, "state": "pending", "step": self.step}, lambda: self._queue(decision)

    def _queue(self, decision: Decision) -> None:
        with self._lock:
            self._pending.append(decision)
