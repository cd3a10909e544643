"""The telemetry bus: ranks publish event batches to the store; collectors read them in order, once each.

A rank's training thread only appends to a deque; one background thread sends a batch every
`interval_s` with a single multi_set (batch + head), so a step never waits on the network and a rank
makes a few store calls per second at most. Each rank deletes its batch RETAIN batches back, so the
store holds the last minute and no more. Collectors only read: the front's and any number of attached
ones (`ddptop attach`) each keep their own position, reading every rank's head with one multi_get and
the new batches with another.
"""

from __future__ import annotations

import collections
import json
import sys
import threading
import time
from typing import Callable

import torch.distributed as dist

from ddptop.control import keys
from ddptop.control.commands import RankLost
from ddptop.fingerprints import FingerprintCheck
from ddptop.events import Event, EventDecodeError, LogLine, RunFinished, decode_events, encode_events

MAX_BATCH_EVENTS = 2000
RETAIN = 240  # batches kept per rank: a minute at 4 batches/s
SAFE_LAG = RETAIN - 40  # a collector further behind than this skips ahead rather than race the deletion


class Publisher:
    def __init__(self, store: dist.Store, rank: int, interval_s: float = 0.25):
        self.store = store
        self.rank = rank
        self.interval_s = interval_s
        self.seq = 0
        self._queue: collections.deque[Event] = collections.deque()
        self._stop = threading.Event()
        self._failed = False
        store.set(keys.tel_head(rank), "0")
        self._thread = threading.Thread(target=self._run, name=f"ddptop-publish-{rank}", daemon=True)
        self._thread.start()

    def emit(self, item) -> None:
        """Queue an Event, or a record whose `resolve()` makes events (a finished step: resolved here, on the
        publisher's thread, so the training thread never builds events or waits for CUDA marks)."""
        self._queue.append(item)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.flush()

    def flush(self) -> None:
        while self._queue and not self._failed:
            batch: list[Event] = []
            while self._queue and len(batch) < MAX_BATCH_EVENTS:
                batch.extend(_events(self._queue.popleft(), self.rank))
            seq = self.seq + 1
            try:
                self.store.multi_set([keys.tel_batch(self.rank, seq), keys.tel_head(self.rank)],
                                     [encode_events(batch), str(seq)])
                if seq > RETAIN:
                    self.store.delete_key(keys.tel_batch(self.rank, seq - RETAIN))
            except Exception:  # the master went away: the control plane reports it at the next step boundary
                self._failed = True
                return
            self.seq = seq

    def close(self) -> None:
        """Stop the thread and send what is queued."""
        self._stop.set()
        self._thread.join(timeout=5)
        self.flush()


def _events(item, rank: int) -> list[Event]:
    if isinstance(item, Event):
        return [item]
    try:
        return item.resolve()
    except Exception as exc:  # a bug in resolving one step must not silence the rank's telemetry
        return [LogLine(rank, "error", f"a step could not be measured: {type(exc).__name__}: {exc}", time.time())]


class Collector:
    """Reads every rank's batches in order, each once. `from_start=False` (attaching to a running job) starts
    at what the store still holds; a collector that falls more than SAFE_LAG batches behind skips ahead
    and says how many batches it missed."""

    def __init__(self, store: dist.Store, world_size: int, on_bad: Callable[[int, str], None] | None = None,
                 from_start: bool = True):
        self.store = store
        self.world_size = world_size
        self.next_seq = [1 if from_start else 0] * world_size  # 0: not positioned yet
        self.missed = [0] * world_size
        self.present: set[int] = set()  # ranks whose head key exists: checked once, not every poll
        self.on_bad = on_bad or (lambda rank, why: print(f"ddptop: rank {rank} sent bad telemetry: {why}",
                                                         file=sys.stderr))

    def poll(self) -> list[Event]:
        head_keys = [keys.tel_head(r) for r in range(self.world_size)]
        if len(self.present) < self.world_size:
            self.present.update(r for r, k in enumerate(head_keys) if r not in self.present and self.store.check([k]))
        present = sorted(self.present)
        if not present:
            return []
        heads = self.store.multi_get([head_keys[r] for r in present])
        wanted: list[tuple[int, int]] = []
        for rank, raw in zip(present, heads):
            try:
                head = int(raw)
            except ValueError:
                self.on_bad(rank, "head is not a number")
                continue
            oldest = max(1, head - SAFE_LAG)
            if self.next_seq[rank] < oldest:
                if self.next_seq[rank] > 0:
                    self.missed[rank] += oldest - self.next_seq[rank]
                    self.on_bad(rank, f"the collector fell behind and skipped {oldest - self.next_seq[rank]} batches")
                self.next_seq[rank] = oldest
            wanted += [(rank, seq) for seq in range(self.next_seq[rank], head + 1)]
        if not wanted:
            return []
        blobs = self.store.multi_get([keys.tel_batch(r, s) for r, s in wanted])
        events: list[Event] = []
        for (rank, seq), blob in zip(wanted, blobs):
            self.next_seq[rank] = seq + 1
            try:
                events.extend(decode_events(blob))
            except EventDecodeError as exc:
                self.on_bad(rank, str(exc))
        return events


class Liveness:
    """Marks a rank lost when its heartbeat has not changed for `lost_after_s` (by the front's own clock,
    so clocks that differ between machines do not matter)."""

    def __init__(self, store: dist.Store, world_size: int, lost_after_s: float = 10.0):
        self.store = store
        self.world_size = world_size
        self.lost_after_s = lost_after_s
        self.last: dict[int, tuple[bytes, float]] = {}
        self.lost: set[int] = set()
        self.finished: set[int] = set()

    def check(self) -> list[Event]:
        now = time.monotonic()
        events: list[Event] = []
        for rank in range(self.world_size):
            key = keys.heartbeat(rank)
            if rank in self.lost or rank in self.finished or not self.store.check([key]):
                continue
            beat = self.store.get(key)
            previous = self.last.get(rank)
            if previous is None or previous[0] != beat:
                self.last[rank] = (beat, now)
            elif now - previous[1] > self.lost_after_s:
                self.lost.add(rank)
                events.append(RankLost(rank, _step_of(beat), f"no heartbeat for {self.lost_after_s:g} s", time.time()))
        return events


def _step_of(beat: bytes) -> int:
    try:
        return int(json.loads(beat).get("step", -1))
    except (ValueError, AttributeError, TypeError):
        return -1


class LiveSource:
    """A Source over the collector, polled from a background thread so callers never block on the store."""

    def __init__(self, collector: Collector, interval_s: float = 0.2, liveness: Liveness | None = None):
        self.collector = collector
        self.liveness = liveness
        self.fingerprints = FingerprintCheck(collector.world_size)  # ranks that must hold one model but do not
        self._next_liveness = 0.0
        self.interval_s = interval_s
        self._lock = threading.Lock()
        self._events: list[Event] = []
        self._stop = threading.Event()
        self.error: str | None = None
        self._thread = threading.Thread(target=self._run, name="ddptop-collector", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._drain_once()
            self._stop.wait(self.interval_s)
        self._drain_once()

    def _drain_once(self) -> None:
        try:
            events = self.collector.poll()
            if self.liveness is not None:
                self.liveness.finished.update(e.rank for e in events if isinstance(e, RunFinished))
                if time.monotonic() >= self._next_liveness:
                    events += self.liveness.check()
                    self._next_liveness = time.monotonic() + 1.0
            events += self.fingerprints.check(events)
        except Exception as exc:
            self.error = str(exc).splitlines()[0]
            return
        if events:
            with self._lock:
                self._events.extend(events)

    def poll(self) -> list[Event]:
        with self._lock:
            out, self._events = self._events, []
        return out

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
