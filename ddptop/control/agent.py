"""The rank side of the control plane: rank 0 takes requests, every rank learns them at the same step boundary.

Agreement: at every step boundary rank 0 broadcasts three integers (newest accepted request, paused,
stop) over a small gloo group, and every rank reads the broadcast launched one boundary earlier. Every rank
therefore sees a request at the same boundary k and applies it before step k, whatever the strategy (even
`single`, whose ranks otherwise drift apart) — no step ever mixes two configurations. Requests accepted
during a pause are applied together at its end, as the newest (each request's config is built on the one
before it): one switch, and every client answered "applied", the earlier ones naming the request that
carried them (`merged_into`). It costs one 24-byte broadcast launch per step, counted in every step's time
and in its `own_s` (ddptop's cost); rank 0's control thread does all store polling, so the broadcast never
waits on the store.

Trust: only rank 0 reads requests (sealed with the token, bound to this job and request id, accepted once
within REQUEST_WINDOW_S, deleted once read); what every rank applies comes from rank 0 over the process
group, sealed with the ranks' key and bound to the request id, never from a store key anyone could write.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Callable

import torch
import torch.distributed as dist

from ddptop.config import SyncConfig
from ddptop.control import keys
from ddptop.control.auth import BadValue, JobKeys
from ddptop.control.commands import Replays, apply_changes, check_request, open_json, read_request, seal_json
from ddptop.errors import DdptopError, PeerLost
from ddptop.events import ControlRefused, Event, RunState, TuneAsked

CLOSE_WAIT_S = 2.0  # what close gives the control thread before cutting its client (a link gone quiet)
POLL_S = 0.05  # rank 0 reads requests this often: a switch lands within a step or two of being sent
STATUS_EVERY_S = 0.5
HEARTBEAT_EVERY_S = 1.0
MAX_BACKLOG = 64  # request ids rank 0 looks at per poll: a counter that jumps further skips the rest, saying so
REQUEST_WAIT_S = 5.0  # an id whose request has not arrived after this long is given up (its client went away)
DECISION_BYTES = 2048  # the sealed decision rank 0 broadcasts, padded (a config is ~150 bytes)


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


class ControlAgent:
    def __init__(self, rank: int, world_size: int, keys: JobKeys, connect: Callable[[], dist.Store],
                 emit: Callable[[Event], None], check: Callable[[SyncConfig], None], initial: SyncConfig,
                 group=None, sweep_segments: int = 0):
        self.rank = rank
        self.world_size = world_size
        self.keys = keys
        self.emit = emit
        self.check = check  # extra checks rank 0 makes against its data (e.g. a batch larger than a shard)
        self.store = connect() if rank == 0 else None  # the training thread's own client: rank 0's answers
        self.group = group if group is not None or world_size == 1 else dist.new_group(backend="gloo")
        self._replays = Replays()
        self._waiting: dict[int, float] = {}  # rank 0: request ids seen in the counter, request not read yet
        self._bad_counter: int | None = None
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
        self._inflight: tuple | None = None  # the broadcast launched at the previous boundary
        self._start_wait = 0.0
        self._latest = initial  # rank 0: the config the newest accepted request leads to
        self._paused = False
        self._stop_requested = False
        self._was_paused = False
        self._halt = threading.Event()
        self.master_lost = ""  # set by the control thread when the store stops answering
        self._client = None  # the control thread's channel client: closed by `close` if it hangs on a dead link
        self._thread = threading.Thread(target=self._run, args=(connect,), name=f"ddptop-control-{rank}",
                                        daemon=True)
        self._thread.start()

    # -- training thread -------------------------------------------------------------------------------
    def boundary(self, step: int) -> Boundary:
        self.step = step
        if self.master_lost:
            raise PeerLost(f"rank {self.rank}: lost the job's master ({self.master_lost}); stopping")
        waited_from = None
        while True:
            request_id, paused, stop = self._exchange()
            if paused != self._was_paused:
                self._was_paused = bool(paused)
                self.emit(RunState(self.rank, step, bool(paused), time.time()))
            if stop or not paused:
                break
            waited_from = waited_from or time.perf_counter()
            time.sleep(POLL_S)
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
            if self.rank == 0:  # before the answer, so a client that reads "applied" sees the new config
                self.store.set(keys.STATUS, seal_json(self.keys.control, keys.CTX_STATUS, self._status()))
        if answer:
            self.answer(decision.request_id, step, segment)

    def answer(self, request_id: int, step: int, segment: int, error: str = "") -> None:
        """Rank 0 answers a `set` request: applied, or rolled back with the reason (a batch that did not fit)."""
        if self.rank != 0 or request_id <= 0:
            return
        body = ({"ok": False, "state": "rolled back", "error": error} if error else {"ok": True, "state": "applied"})
        for earlier in self._merged.pop(request_id, []):  # their changes went in (or out) with this one
            self._answer(self.store, earlier, {**body, "step": step, "segment": segment, "merged_into": request_id})
        self._answer(self.store, request_id, {**body, "step": step, "segment": segment})

    def _answer(self, store: dist.Store, request_id: int, response: dict) -> None:
        store.set(keys.ctl_response(request_id),
                  seal_json(self.keys.control, keys.ctx_response(self.keys.job_id, request_id), response))

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
        stop. Other ranks contribute a buffer to receive into."""
        if self.rank != 0:
            return [0, 0, 0]
        with self._lock:
            if self._pending:
                decision = self._pending.popleft()
                self._sent[decision.request_id] = decision
                self._sent_id = decision.request_id
            return [self._sent_id, int(self._paused), int(self._stop_requested)]

    def _exchange(self) -> tuple[int, int, int]:
        """The state rank 0 broadcast one boundary ago, and the next broadcast launched (async_op).

        Pipelined so that no rank waits here for a slower one: by the time a rank reaches boundary k, the
        broadcast launched at k−1 has long completed on every rank that took part in step k−1's collectives
        (under `single`, ranks may drift one step apart at most). The cost is a launch, and a switch lands
        one boundary later than a blocking broadcast would apply it."""
        if self.group is None:
            return tuple(self._state())
        first = self._inflight is None
        if first:  # the first boundary: every rank starts here together
            self._inflight = self._launch()
        handle, flags = self._inflight
        began = time.perf_counter()
        handle.wait()
        if first:  # waiting for the last rank to start is not ddptop's cost: set aside like a pause
            self._start_wait = time.perf_counter() - began
        self._inflight = self._launch()
        return tuple(int(x) for x in flags.tolist())

    def _launch(self) -> tuple:
        flags = torch.tensor(self._state(), dtype=torch.int64)
        return dist.broadcast(flags, src=0, group=self.group, async_op=True), flags

    def _decision(self, request_id: int) -> Decision:
        """Rank 0's decision for `request_id`, broadcast to every rank and checked there (never read from the store)."""
        context = keys.ctx_decision(self.keys.job_id, request_id)
        buffer = torch.zeros(DECISION_BYTES, dtype=torch.uint8)
        mine = self._take_sent(request_id) if self.rank == 0 else None
        if mine is not None:
            blob = seal_json(self.keys.ranks, context, {"config": mine.config.to_dict(), "who": mine.who})
            buffer[:4] = torch.tensor(list(len(blob).to_bytes(4, "big")), dtype=torch.uint8)
            buffer[4:4 + len(blob)] = torch.tensor(list(blob), dtype=torch.uint8)
        if self.group is not None:
            dist.broadcast(buffer, src=0, group=self.group)
        if self.rank == 0:
            return mine
        raw = bytes(buffer.tolist())
        try:
            size = int.from_bytes(raw[:4], "big")
            body = open_json(self.keys.ranks, context, raw[4:4 + min(size, DECISION_BYTES - 4)], DECISION_BYTES)
            return Decision(request_id, SyncConfig(**body["config"]), str(body["who"]))
        except (BadValue, DdptopError, KeyError, TypeError) as exc:  # only a corrupted process group gets here
            raise PeerLost(f"rank {self.rank}: rank 0's decision for request {request_id} does not verify ({exc}); "
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
        client = self._client
        if self._thread.is_alive() and client is not None and hasattr(client, "close"):
            client.close()  # a heartbeat blocked on a link gone quiet fails now: the rank leaves to say why
            self._thread.join(timeout=1)
        if self.group is not None:
            if self._inflight is not None:
                try:  # every rank launched the same broadcasts: the last one completes unless a peer is gone
                    self._inflight[0].wait()
                except Exception:
                    pass
            dist.destroy_process_group(self.group)

    # -- control thread ---------------------------------------------------------------------------------
    def _run(self, connect: Callable[[], dist.Store]) -> None:
        try:
            store = self._client = connect()
        except DdptopError as exc:
            self.master_lost = str(exc)
            return
        next_status = next_beat = 0.0
        beats = 0
        seen = 0
        while not self._halt.wait(POLL_S):
            now = time.monotonic()
            try:
                if now >= next_beat:
                    beats += 1
                    store.set(keys.heartbeat(self.rank), seal_json(
                        self.keys.ranks, keys.ctx_heartbeat(self.keys.job_id, self.rank),
                        {"step": self.step, "beat": beats, "paused": self._was_paused}))
                    next_beat = now + HEARTBEAT_EVERY_S
                if self.rank != 0:
                    continue
                seen = self._take_requests(store, seen)
                if now >= next_status:
                    with self._lock:  # never a stale config over the one `applied` just wrote
                        store.set(keys.STATUS, seal_json(self.keys.control, keys.CTX_STATUS, self._status()))
                    next_status = now + STATUS_EVERY_S
            except Exception as exc:  # the store (on the master) went away: the next step boundary stops this rank
                store = self._client = self._reconnect(connect, exc)
                if store is None:
                    return

    def _reconnect(self, connect: Callable[[], dist.Store], exc: Exception) -> dist.Store | None:
        """A store that answers again gets a fresh client (the server drops a client after one bad request);
        one that does not means the master is gone."""
        try:
            return connect()
        except Exception:
            text = str(exc).strip()
            self.master_lost = text.splitlines()[0][:120] if text else type(exc).__name__
            return None

    def _status(self) -> dict:
        # handed_out: the newest request rank 0 has broadcast to the ranks; while paused, the ones handed out by the
        # resume apply together at its first step (a client that waits for that reads it here)
        return {"step": self.step, "segment": self.segment, "config": self.config.to_dict(),
                "paused": self._was_paused, "world_size": self.world_size, "t": time.time(),
                "job": self.keys.job_id, "handed_out": self._sent_id}

    def _take_requests(self, store: dist.Store, seen: int) -> int:
        """Read the requests whose ids the counter has handed out since `seen`; never wait on one."""
        newest = store.add(keys.CTL_SEQ, 0)
        if not 0 <= newest < keys.MAX_COUNTER or newest < seen:
            if newest != self._bad_counter:  # said once per value, not twenty times a second
                self._refuse(newest, f"the request counter holds {newest}, not a count after {seen}: ignored")
                self._bad_counter = newest
            return seen if newest < 0 or newest >= keys.MAX_COUNTER else newest
        if newest - seen > MAX_BACKLOG:
            self._refuse(newest, f"the request counter jumped from {seen} to {newest}: only the last {MAX_BACKLOG} "
                                 "ids are read")
            seen = newest - MAX_BACKLOG
        now = time.monotonic()
        self._waiting.update((request_id, now) for request_id in range(seen + 1, newest + 1))
        for request_id, since in sorted(self._waiting.items()):
            if store.check([keys.ctl_request(request_id)]):
                del self._waiting[request_id]
                self._take(store, request_id)
            elif now - since > REQUEST_WAIT_S:
                del self._waiting[request_id]
        return newest

    def _refuse(self, request_id: int, reason: str) -> None:
        self.emit(ControlRefused(request_id, reason, time.time()))

    def _take(self, store: dist.Store, request_id: int) -> None:
        """Answer a request, then act on it: a `set` queued before its "pending" answer was written could be applied
        and answered "applied" by the training thread first, and "pending" then overwrote "applied" (under load
        `ctl` waited out its 30 s)."""
        raw = store.get(keys.ctl_request(request_id))
        store.delete_key(keys.ctl_request(request_id))  # used once: a copy left in the store replays nothing
        then = None
        try:
            request = read_request(self.keys, request_id, raw, self._replays)
            response, then = self._accept(request_id, request)
        except (ValueError, DdptopError) as exc:
            reason = str(exc)
            self._refuse(request_id, reason)
            response = {"ok": False, "error": reason}
        self._answer(store, request_id, response)
        if then is not None:
            then()

    def _accept(self, request_id: int, request: dict) -> tuple[dict, Callable[[], None] | None]:
        """The answer to a valid request and what follows it once the answer is written (None: nothing)."""
        op = request["op"]
        with self._lock:
            check_request(op, self.world_size, self.sweep_segments, self._latest)
            if op == "pause":
                self._paused = True
            elif op == "resume":
                self._paused = False
            elif op == "stop":
                self._stop_requested = True
            if op == "tune":
                return {"ok": True, "state": "pending", "step": self.step}, lambda: self.emit(
                    TuneAsked(self.rank, request_id, request["who"], time.time()))
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
