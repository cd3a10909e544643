"""The telemetry bus: ranks publish event batches to the store; collectors read them in order, once each.

A rank's training thread only appends to a deque; one background thread sends a batch every
`interval_s` with a single multi_set (batch + head), so a step never waits on the network and a rank
makes a few store calls per second at most. Each rank deletes its batch RETAIN batches back, so the
store holds the last minute and no more. Collectors only read: the front's and any number of attached
ones (`ddptop attach`) each keep their own position, reading every rank's head with one multi_get and
the new batches with another. A write that fails (the master restarting, a dropped client) is sent again
with a fresh client once the store answers; meanwhile the queue is bounded, and what it drops skips a
sequence number, so the loss reaches every collector as a gap like any other.

Every batch, head and heartbeat is sealed with the ranks' key and bound to its rank and sequence number
(auth.py), and travels over the job's channel (channel.py). A collector never asks for a key it has not seen
exist (a missing key would block a multi_get for the store's whole timeout), and every batch it does not
get is a TelemetryGap event: loss is stated, never silent.
"""

from __future__ import annotations

import collections
import json
import threading
import time
from typing import Callable

import torch.distributed as dist

from ddptop.control import keys
from ddptop.control.auth import BadValue, JobKeys, seal, unseal
from ddptop.control.commands import open_json
from ddptop.events import (FRONT, MAX_EVENT_BYTES, Event, EventDecodeError, EventsRefused, LogLine, RankBack, RankLost,
                           StoreFlooded, TelemetryGap, decode_batch)
from ddptop.safe import clean

MAX_BATCH_EVENTS = 2000
MAX_QUEUE = 4096  # items a rank queues at most: a healthy publisher drains 8000 events a second (4 x 2000), so
# only a store that is away fills it; then the oldest go (each step holds its CUDA marks until resolved)
RETAIN = 240  # batches kept per rank: a minute at 4 batches/s
SAFE_LAG = RETAIN - 40  # a collector further behind than this skips ahead rather than race the deletion
CLOSE_WAIT_S = 2.0  # what a closing publisher gives a write that makes no progress (a front gone, a cut link)
MAX_READ = 32  # batches read per rank and poll: bounds one poll's memory (32 x 4 MiB at most)


class Publisher:
    """`connect` gives a fresh client after a failed write (the control agent's way: the server drops a client
    after one bad request); without it the same client is tried again. What a full queue dropped skips a
    sequence number, so every collector reports it as a TelemetryGap, and a log line after it says how much."""

    def __init__(self, store: dist.Store, rank: int, job: JobKeys, interval_s: float = 0.25,
                 connect: Callable[[], dist.Store] | None = None, max_queue: int = MAX_QUEUE):
        self.store: dist.Store | None = store  # None: the last write failed, `_run` connects again
        self.rank = rank
        self.job = job
        self.interval_s = interval_s
        self.max_queue = max_queue
        self.seq = 0
        self.dropped = 0  # items a full queue dropped, in all
        self._connect = connect or (lambda: store)
        self._queue: collections.deque = collections.deque()  # what emit gave: events and finished steps
        self._ready: collections.deque[Event] = collections.deque()  # resolved, not sent yet: flush's own
        self._unsent: tuple[int, bytes] | None = None  # a sealed batch whose write failed: sent again, same seq
        self._unreported = 0  # dropped items no skipped sequence number stands for yet
        self._drop_lock = threading.Lock()
        self._flush_lock = threading.Lock()  # one flush at a time (the thread's, close's): each seq names one batch
        self._stop = threading.Event()
        store.set(keys.tel_head(rank), self._head(0))
        self._thread = threading.Thread(target=self._run, name=f"ddptop-publish-{rank}", daemon=True)
        self._thread.start()

    def emit(self, item) -> None:
        """Queue an Event, or a record whose `resolve()` makes events (a finished step: resolved here, on the
        publisher's thread, so the training thread never builds events or waits for CUDA marks)."""
        self._queue.append(item)
        if len(self._queue) > self.max_queue:
            self._drop()

    def _drop(self) -> None:
        with self._drop_lock:  # emit runs on several threads (training, sampler, control): one count
            while len(self._queue) > self.max_queue:
                try:
                    self._queue.popleft()
                except IndexError:  # flush took it meanwhile
                    break
                self.dropped += 1
                self._unreported += 1

    @property
    def queued(self) -> int:
        """Items waiting to be sent: at most max_queue, plus one resolved step's events."""
        return len(self._queue) + len(self._ready)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            if self.store is None:
                self._reconnect()
            self.flush()

    def _reconnect(self) -> None:
        try:
            self.store = self._connect()
        except Exception:  # still away: tried again next interval; the control plane says if the master is gone
            pass

    def _head(self, seq: int) -> bytes:
        return seal(self.job.ranks, keys.ctx_head(self.job.job_id, self.rank), str(seq).encode())

    def _next_batch(self) -> bytes:
        """Queued events as one JSON list of at most MAX_BATCH_EVENTS events and MAX_BATCH_BYTES."""
        parts: list[bytes] = []
        size = 2
        while len(parts) < MAX_BATCH_EVENTS:
            if not self._ready:
                try:
                    item = self._queue.popleft()
                except IndexError:
                    break
                self._ready.extend(_events(item, self.rank))  # a finished step: resolved here, off the training thread
                continue
            part = json.dumps(self._ready[0].to_dict(), separators=(",", ":")).encode()
            if parts and size + len(part) + 1 > keys.MAX_BATCH_BYTES:
                break
            self._ready.popleft()
            if len(part) > MAX_EVENT_BYTES:  # never happens with ddptop's own events (a VGG step's spans: ~10 KB)
                part = json.dumps(LogLine(self.rank, "error", f"dropped a {len(part)}-byte event",
                                          time.time()).to_dict()).encode()
            parts.append(part)
            size += len(part) + 1
        return b"[" + b",".join(parts) + b"]"

    def _seal_next(self) -> tuple[int, bytes]:
        """The next batch and its seq; items dropped since the last one cost a seq no batch takes (a gap)."""
        with self._drop_lock:
            lost, self._unreported = self._unreported, 0
        seq = self.seq + 1
        if lost:
            seq += 1
            self._ready.appendleft(LogLine(self.rank, "warning", f"telemetry batch {seq - 1} stands for {lost} "
                                           "items dropped while the store was unreachable or slow", time.time()))
        return seq, seal(self.job.ranks, keys.ctx_tel(self.job.job_id, self.rank, seq), self._next_batch())

    def flush(self) -> None:
        """Send what is queued. A batch whose write fails is kept and sent again, under the same seq, once
        `_run` has a client that answers: a store that comes back loses nothing the queue still holds."""
        with self._flush_lock:
            while self.store is not None and (self._unsent or self._queue or self._ready or self._unreported):
                if self._unsent is None:
                    self._unsent = self._seal_next()
                seq, blob = self._unsent
                try:
                    self.store.multi_set([keys.tel_batch(self.rank, seq), keys.tel_head(self.rank)],
                                         [blob, self._head(seq)])
                    if seq > RETAIN:
                        self.store.delete_key(keys.tel_batch(self.rank, seq - RETAIN))
                except Exception:  # the master went away or dropped this client: `_run` connects again
                    self.store = None
                    return
                self.seq, self._unsent = seq, None

    def close(self) -> None:
        """Stop the thread and send what is queued: after the thread's flush, never beside it (the lock). A rank
        whose link to the front went away ends within CLOSE_WAIT_S of here, not after its client's timeout (60 s: each call waits for the channel's answer):
        a write that makes no progress for that long is cut, and the last flush waits CLOSE_WAIT_S at most."""
        self._stop.set()
        sent, since = self.seq, time.monotonic()
        while self._thread.is_alive():  # a backlog that is being sent is waited for, however long
            self._thread.join(timeout=0.2)
            if self.seq != sent:
                sent, since = self.seq, time.monotonic()
            elif time.monotonic() - since > CLOSE_WAIT_S:
                store = self.store
                if store is not None and hasattr(store, "close"):
                    store.close()  # the thread's blocked write fails now; what it held is lost with the link
                self._thread.join(timeout=1)
                break
        if self.store is not None and hasattr(self.store, "timeout_s"):
            self.store.timeout_s = min(self.store.timeout_s, CLOSE_WAIT_S)
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
    at what the store still holds; a collector that falls more than SAFE_LAG batches behind skips ahead.
    Every batch it skips, finds missing or refuses becomes a TelemetryGap event; the events of a batch that fail
    the typed decoding or claim another rank are refused one by one and counted in an EventsRefused event."""

    def __init__(self, store: dist.Store, world_size: int, job: JobKeys, from_start: bool = True):
        self.store = store
        self.world_size = world_size
        self.job = job
        self.next_seq = [1 if from_start else 0] * world_size  # 0: not positioned yet
        self.missed = [0] * world_size
        self.present: set[int] = set()  # ranks whose head key exists: checked once, not every poll
        self._gaps: list[Event] = []

    def poll(self) -> list[Event]:
        self._gaps = []
        head_keys = [keys.tel_head(r) for r in range(self.world_size)]
        if len(self.present) < self.world_size:
            self.present.update(r for r, k in enumerate(head_keys) if r not in self.present and self.store.check([k]))
        present = sorted(self.present)
        if not present:
            return []
        wanted: list[tuple[int, int]] = []
        for rank, raw in zip(present, self.store.multi_get([head_keys[r] for r in present])):
            head = self._head(rank, raw)
            if head is None:  # not ours: look for the next batch itself, so a bad head never stalls a rank
                head = self.next_seq[rank] if self.next_seq[rank] and self.store.check(
                    [keys.tel_batch(rank, self.next_seq[rank])]) else self.next_seq[rank] - 1
            self._position(rank, head)
            wanted += [(rank, seq) for seq in range(self.next_seq[rank], min(head, self.next_seq[rank] + MAX_READ - 1) + 1)]
        events = self._read(wanted)
        return events + self._gaps

    def _head(self, rank: int, raw: bytes) -> int | None:
        try:
            head = int(unseal(self.job.ranks, keys.ctx_head(self.job.job_id, rank), raw, 32))
        except ValueError:  # BadValue, or not a number
            return None
        return head if 0 <= head < keys.MAX_COUNTER else None

    def _position(self, rank: int, head: int) -> None:
        oldest = max(1, head - SAFE_LAG)
        if self.next_seq[rank] < oldest:
            if self.next_seq[rank] > 0:
                self._gap(rank, self.next_seq[rank], oldest - 1, "the collector fell behind; the store had dropped them")
            self.next_seq[rank] = oldest

    def _read(self, wanted: list[tuple[int, int]]) -> list[Event]:
        names = [keys.tel_batch(r, s) for r, s in wanted]
        if wanted and not self.store.check(names):  # some are gone: read only those that exist
            there = [self.store.check([name]) for name in names]
            for (rank, seq), ok in zip(wanted, there):
                if not ok:
                    self._gap(rank, seq, seq, "missing from the store")
            wanted = [w for w, ok in zip(wanted, there) if ok]
            names = [n for n, ok in zip(names, there) if ok]
        events: list[Event] = []
        for (rank, seq), blob in zip(wanted, self.store.multi_get(names) if names else []):
            self.next_seq[rank] = max(self.next_seq[rank], seq + 1)
            try:
                good, bad = decode_batch(unseal(self.job.ranks, keys.ctx_tel(self.job.job_id, rank, seq), blob,
                                                keys.MAX_BATCH_BYTES), rank)
            except (BadValue, EventDecodeError) as exc:
                self._gap(rank, seq, seq, f"refused: {exc}")
                continue
            events.extend(good)
            if bad:  # one bad event costs itself, not its batch; a rank's batch speaks for that rank alone
                events.append(EventsRefused(rank, seq, len(bad), clean(bad[0], 200), time.time()))
        return events

    def _gap(self, rank: int, first: int, last: int, reason: str) -> None:
        self.missed[rank] += last - first + 1
        self.next_seq[rank] = max(self.next_seq[rank], last + 1)
        self._gaps.append(TelemetryGap(rank, first, last, reason, time.time()))


REFUSALS_EVERY_S = 30.0  # a flood that goes on is said again at most this often, not once a second
CHANNEL_REFUSALS = {"refused_writes": "refused writes past its cap on bytes held",
                    "flooded": "closed connections beyond its cap on unauthenticated ones (a flood)",
                    "failed_handshakes": "refused connections that did not prove the job key",
                    "bad_frames": "dropped connections whose frame failed its MAC, size cap or deadline"}


class Liveness:
    """Marks a rank lost when no new valid heartbeat came for `lost_after_s` (by the front's own clock, so
    clocks that differ between machines do not matter), and back when one comes again."""

    def __init__(self, store: dist.Store, world_size: int, job: JobKeys, lost_after_s: float = 10.0,
                 public: dist.Store | None = None):
        self.store = store
        self.public = public or store  # whose keys are counted: torch's store, which anyone on its port can fill
        self.world_size = world_size
        self.job = job
        self.lost_after_s = lost_after_s
        self.last: dict[int, tuple[int, float, int]] = {}  # rank -> (beat, when it changed, step)
        self.lost: dict[int, float] = {}  # rank -> when it was marked lost
        self.refused: dict[int, str] = {}  # rank -> why its newest heartbeat was refused
        self.finished: set[int] = set()
        # every key the job writes: RETAIN batches, a head and a heartbeat per rank, the process groups' keys
        # (a few per rank and group), the handshake and control keys; a store holding more is being filled
        self.max_keys = world_size * (RETAIN + 16) + 1024
        self.flooded = False
        self.said: dict[str, tuple[int, float]] = {}  # the channel's refusals reported: (count, when)

    def check(self) -> list[Event]:
        now = time.monotonic()
        events: list[Event] = []
        count = self.public.num_keys()
        if count > self.max_keys and not self.flooded:
            events.append(StoreFlooded(count, self.max_keys, time.time()))
        self.flooded = count > self.max_keys
        events += self._channel_refusals()
        for rank in range(self.world_size):
            key = keys.heartbeat(rank)
            if rank in self.finished or not self.store.check([key]):
                continue
            beat = self._beat(rank, self.store.get(key))
            previous = self.last.get(rank)
            if beat is not None and (previous is None or beat[0] > previous[0]):
                self.last[rank] = (beat[0], now, beat[1])
                if rank in self.lost:
                    events.append(RankBack(rank, beat[1], round(now - previous[1], 1) if previous else 0.0,
                                           time.time()))
                    del self.lost[rank]
            elif previous is not None and rank not in self.lost and now - previous[1] > self.lost_after_s:
                self.lost[rank] = now
                why = f" (the newest was refused: {self.refused[rank]})" if rank in self.refused else ""
                events.append(RankLost(rank, previous[2], f"no heartbeat for {self.lost_after_s:g} s{why}", time.time()))
        return events

    def _channel_refusals(self) -> list[Event]:
        """One line per kind of refusal on the job's channel when it grows: writes past its byte cap, connection
        floods, failed handshakes (a wrong token, a stranger), frames that failed their MAC or deadline."""
        stats = getattr(self.store, "stats", None)
        if stats is None:  # a plain store (tests of the bus alone)
            return []
        now, at = stats(), time.monotonic()
        out = []
        for what, words in CHANNEL_REFUSALS.items():
            count, when = self.said.get(what, (0, -REFUSALS_EVERY_S))
            if now.get(what, 0) > count and at - when >= REFUSALS_EVERY_S:
                out.append(LogLine(FRONT, "warning", f"the job's channel {words}: {now[what]} so far "
                                   f"({now['held'] / 2**20:.1f} MiB held; README: trust model)", time.time()))
                self.said[what] = (now[what], at)
        return out

    def _beat(self, rank: int, raw: bytes) -> tuple[int, int] | None:
        """(beat counter, step) of a valid heartbeat, else None (and the reason kept for the RankLost line)."""
        try:
            beat = open_json(self.job.ranks, keys.ctx_heartbeat(self.job.job_id, rank), raw, keys.MAX_SMALL_BYTES)
            counter, step = beat.get("beat"), beat.get("step")
            if not all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v < keys.MAX_COUNTER
                       for v in (counter, step)):
                raise BadValue("beat or step out of range")
        except BadValue as exc:
            self.refused[rank] = str(exc)
            return None
        self.refused.pop(rank, None)
        return counter, step


class LiveSource:
    """A Source over the collector, polled from a background thread so callers never block on the store."""

    def __init__(self, collector: Collector, interval_s: float = 0.2):
        self.collector = collector
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
            self.inject(self.collector.poll())
        except Exception as exc:
            self.error = (str(exc).splitlines() or [type(exc).__name__])[0]

    def inject(self, events: list[Event]) -> None:
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
