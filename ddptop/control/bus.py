"""The telemetry bus: ranks PUSH event batches and heartbeats to the front; its Collector checks each rank's order.

A rank's training thread only appends to a deque; one background thread sends a batch every `interval_s` on
the rank's PUSH socket (transport.py: CURVE, the rank's key) without ever blocking: a step never waits on the
network. A batch is one ZeroMQ message: a JSON list of the events' wire forms and, where it holds steps, one binary
step block whose records take the places whole numbers hold in the list (events.decode_batch). ZeroMQ keeps what the front has not read yet, up to transport.SEND_HWM batches (a front stopped for
minutes loses nothing and receives it all when it continues); past that the batch stays here and the deque
bounds what waits behind it: what it drops skips a sequence number, so the loss reaches the front as a
TelemetryGap like any other, and a log line says how much.

The front (hub.py) receives every rank's batches on one PULL socket, in each rank's order (one connection per
rank), and republishes them on its PUB socket for `ddptop attach`, whose Collector does the same checks. A
sequence number that is skipped, a batch that is refused, a subscriber that fell behind: each is a TelemetryGap
event, never a silent hole. Nothing is polled, nothing deleted: a batch is sent once and read once.
"""

from __future__ import annotations

import collections
import json
import threading
import time
from typing import Callable

import zmq

from ddptop.control import keys
from ddptop.events import (FRONT, MAX_EVENT_BYTES, Event, EventDecodeError, EventsRefused, LogLine, RankBack, RankLost,
                           StepDone, StoreFlooded, TelemetryGap, decode_batch, step_block, step_record)
from ddptop.safe import clean

MAX_BATCH_EVENTS = 2000
MAX_QUEUE = 4096  # items a rank queues at most behind a full socket (the front away for minutes): then the oldest go
CLOSE_WAIT_S = 2.0  # what a closing publisher gives its socket to hand the last batches on (a front gone, a cut link)
STEP_HEADER_BYTES = 4  # a step block's header (events.STEP_MAGIC and the record size)
TEL, BEAT = b"t", b"h"  # the first part of a rank's message: a telemetry batch [t, rank, seq, JSON list, step block
# where it has steps], a heartbeat
# [h, rank, {"beat", "step", "paused"}]


class Publisher:
    """`sock`: the rank's PUSH socket (transport.client_socket), used by this publisher's thread alone (and by
    close once the thread ended). What a full queue dropped skips a sequence number: a TelemetryGap at the front."""

    def __init__(self, sock, rank: int, interval_s: float = 0.25, max_queue: int = MAX_QUEUE):
        self.sock = sock
        self.rank = rank
        self.interval_s = interval_s
        self.max_queue = max_queue
        self.seq = 0
        self.dropped = 0  # items a full queue dropped, in all
        self.held = 0  # times the socket was full (the front not reading): the batch waited here
        self._queue: collections.deque = collections.deque()  # what emit gave: events and finished steps
        self._ready: collections.deque[Event] = collections.deque()  # resolved, not sent yet: flush's own
        self._unsent: tuple[int, list[bytes]] | None = None  # a batch the full socket did not take: again, same seq
        self._unreported = 0  # dropped items no skipped sequence number stands for yet
        self._drop_lock = threading.Lock()
        self._flush_lock = threading.Lock()  # one flush at a time (the thread's, close's): each seq names one batch
        self._stop = threading.Event()
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
            self.flush()

    def _next_batch(self) -> list[bytes]:
        """Queued events as one batch of at most MAX_BATCH_EVENTS events and MAX_BATCH_BYTES: a JSON list of their
        wire forms and, where it holds steps, a step block (events.step_block: 193 bytes a step and one struct.pack,
        where JSON cost the publisher and the front most of their work per step, issue 42) whose records take the
        places that whole numbers hold in the list (n: the next n steps), so every event keeps its order."""
        items: list[bytes | int] = []
        records: list[bytes] = []
        size, count = 2 + STEP_HEADER_BYTES, 0
        while count < MAX_BATCH_EVENTS:
            if not self._ready:
                try:
                    item = self._queue.popleft()
                except IndexError:
                    break
                self._ready.extend(_events(item, self.rank))  # a finished step: resolved here, off the training thread
                continue
            event = self._ready[0]
            record = step_record(event) if type(event) is StepDone else None
            part = record if record is not None else self._json(event)
            if count and size + len(part) + 8 > keys.MAX_BATCH_BYTES:  # 8: a run's count and its comma at most
                break
            self._ready.popleft()
            if record is None:
                items.append(part)
            elif items and type(items[-1]) is int:
                items[-1] += 1
                records.append(record)
            else:
                items.append(1)
                records.append(record)
            size += len(part) + 8
            count += 1
        blob = b"[" + b",".join(x if type(x) is bytes else b"%d" % x for x in items) + b"]"
        return [blob, step_block(records)] if records else [blob]

    def _json(self, event: Event) -> bytes:
        part = json.dumps(event.to_wire(), separators=(",", ":")).encode()
        if len(part) > MAX_EVENT_BYTES:  # never happens with ddptop's own events (a VGG step's spans: ~10 KB)
            part = json.dumps(LogLine(self.rank, "error", f"dropped a {len(part)}-byte event",
                                      time.time()).to_wire()).encode()
        return part

    def _numbered_next(self) -> tuple[int, list[bytes]]:
        """The next batch and its seq; items dropped since the last one cost a seq no batch takes (a gap)."""
        with self._drop_lock:
            lost, self._unreported = self._unreported, 0
        seq = self.seq + 1
        if lost:
            seq += 1
            self._ready.appendleft(LogLine(self.rank, "warning", f"telemetry batch {seq - 1} stands for {lost} "
                                           "items dropped while the front was not reading", time.time()))
        return seq, self._next_batch()

    def flush(self) -> None:
        """Send what is queued, never blocking: a batch the full socket does not take is kept and sent again,
        under the same seq, at the next interval; a front that comes back loses nothing the queue still holds."""
        with self._flush_lock:
            while self.sock is not None and (self._unsent or self._queue or self._ready or self._unreported):
                if self._unsent is None:
                    self._unsent = self._numbered_next()
                seq, blobs = self._unsent
                try:
                    self.sock.send_multipart([TEL, str(self.rank).encode(), str(seq).encode(), *blobs], zmq.NOBLOCK)
                except zmq.Again:  # the socket holds SEND_HWM batches the front has not read: wait here
                    self.held += 1
                    return
                self.seq, self._unsent = seq, None

    def close(self) -> None:
        """Stop the thread, send what is queued, and give the socket CLOSE_WAIT_S to hand it to the front (a
        front gone or a cut link costs that long, never more)."""
        self._stop.set()
        self._thread.join(timeout=CLOSE_WAIT_S)
        self.flush()
        if self.sock is not None:
            self.sock.close(linger=int(CLOSE_WAIT_S * 1000))
            self.sock = None


def _events(item, rank: int) -> list[Event]:
    if isinstance(item, Event):
        return [item]
    try:
        return item.resolve()
    except Exception as exc:  # a bug in resolving one step must not silence the rank's telemetry
        return [LogLine(rank, "error", f"a step could not be measured: {type(exc).__name__}: {exc}", time.time())]


class Collector:
    """Checks each rank's batches: in order, each once. `from_start=False` (attaching to a running job) starts at
    the first batch it sees. A skipped sequence number (a batch the rank dropped, or a subscriber that fell
    behind) and a refused batch become TelemetryGap events; the events of a batch that fail the typed decoding or
    claim another rank are refused one by one and counted in an EventsRefused event."""

    def __init__(self, world_size: int, from_start: bool = True):
        self.world_size = world_size
        self.next_seq = [1 if from_start else 0] * world_size  # 0: not positioned yet
        self.missed = [0] * world_size
        self.batches = 0

    def take(self, rank: int, seq: int, blob: bytes, steps: bytes | None = None) -> list[Event]:
        """Batch `seq` of `rank`: its JSON list and its step block (Publisher._next_batch, events.decode_batch)."""
        if not 0 <= rank < self.world_size or not 0 < seq < keys.MAX_COUNTER:
            return []
        out: list[Event] = []
        expected = self.next_seq[rank] or seq
        if seq < expected:  # sent once, read once: only a rank that restarted its count gets here
            return [TelemetryGap(rank, seq, seq, f"batch {seq} came again after {expected - 1}: ignored", time.time())]
        if seq > expected:
            out.append(self._gap(rank, expected, seq - 1, "never received: dropped by the rank while the front "
                                 "did not read, or by a subscriber that fell behind"))
        self.next_seq[rank] = seq + 1
        self.batches += 1
        try:
            good, bad = decode_batch(blob, rank, keys.MAX_BATCH_BYTES, steps)
        except EventDecodeError as exc:
            return out + [self._gap(rank, seq, seq, f"refused: {exc}")]
        out.extend(good)
        if bad:  # one bad event costs itself, not its batch; a rank's batch speaks for that rank alone
            out.append(EventsRefused(rank, seq, len(bad), clean(bad[0], 200), time.time()))
        return out

    def _gap(self, rank: int, first: int, last: int, reason: str) -> Event:
        self.missed[rank] += last - first + 1
        return TelemetryGap(rank, first, last, reason, time.time())


def receive(parts: list[bytes], collector: Collector, liveness: "Liveness | None") -> list[Event] | None:
    """A rank's message (TEL or BEAT), or None when it is not one (counted by the caller)."""
    try:
        kind, rank = parts[0], int(parts[1])
        if kind == TEL and len(parts) in (4, 5):
            return collector.take(rank, int(parts[2]), *parts[3:])
        if kind == BEAT and len(parts) == 3 and len(parts[2]) <= keys.MAX_SMALL_BYTES:
            beat = json.loads(parts[2])
            if liveness is not None:
                liveness.beat(rank, beat.get("beat"), beat.get("step"))
            return []
    except (ValueError, IndexError, AttributeError, RecursionError):
        pass
    return None


REFUSALS_EVERY_S = 30.0  # a flood that goes on is said again at most this often, not once a second
REFUSALS = {"refused_keys": "refused connections whose key is not one of the job's roles (a wrong token, a "
                            "stranger)",
            "bad_messages": "dropped messages that are not a rank's batch or heartbeat, or a request its role may "
                            "not make",
            "dropped": "dropped events while its own queue was full (the screen or recording behind)"}


STALLED_S = 5.0  # checks come every second (front.pipeline): a longer pause means the front itself was stopped


class Liveness:
    """Marks a rank lost when no new heartbeat came for `lost_after_s` (by the front's own clock, so clocks that
    differ between machines do not matter), and back when one comes again. `beat` is called by the receiving
    thread, `check` by the pipeline's. `public`: torch's store, whose key count is watched (anyone on its port
    can fill it); `stats`: the front's refusals (hub.Hub.stats)."""

    def __init__(self, world_size: int, lost_after_s: float = 10.0, public=None,
                 stats: Callable[[], dict] | None = None):
        self.public = public
        self.stats = stats
        self.world_size = world_size
        self.lost_after_s = lost_after_s
        self.beats: dict[int, tuple[int, int]] = {}  # rank -> newest (beat, step) received
        self.last: dict[int, tuple[int, float, int]] = {}  # rank -> (beat, when it changed, step)
        self.lost: dict[int, float] = {}  # rank -> when it was marked lost
        self.finished: set[int] = set()
        # the process groups' keys (a few per rank and group) and the handshake's; a store holding more is being filled
        self.max_keys = world_size * 16 + 1024
        self.flooded = False
        self.said: dict[str, tuple[int, float]] = {}  # refusals reported: (count, when)
        self._lock = threading.Lock()
        self._checked = time.monotonic()

    def beat(self, rank: object, beat: object, step: object) -> None:
        if not all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v < keys.MAX_COUNTER
                   for v in (rank, beat, step)) or rank >= self.world_size:
            raise ValueError("a heartbeat out of range")
        with self._lock:
            if beat > self.beats.get(rank, (-1, 0))[0]:
                self.beats[rank] = (beat, step)

    def check(self) -> list[Event]:
        now = time.monotonic()
        if now - self._checked > STALLED_S:  # the front itself did not run (stopped, a paused VM): the ranks' beats
            # wait in their sockets, so every rank's silence is counted from now, not from before the stall
            self.last = {rank: (beat, now, step) for rank, (beat, _, step) in self.last.items()}
        self._checked = now
        events: list[Event] = []
        if self.public is not None:
            count = self.public.num_keys()
            if count > self.max_keys and not self.flooded:
                events.append(StoreFlooded(count, self.max_keys, time.time()))
            self.flooded = count > self.max_keys
        events += self._refusals()
        with self._lock:
            beats = dict(self.beats)
        for rank in range(self.world_size):
            if rank in self.finished:
                continue
            beat, previous = beats.get(rank), self.last.get(rank)
            if beat is not None and (previous is None or beat[0] > previous[0]):
                self.last[rank] = (beat[0], now, beat[1])
                if rank in self.lost:
                    events.append(RankBack(rank, beat[1], round(now - previous[1], 1) if previous else 0.0,
                                           time.time()))
                    del self.lost[rank]
            elif previous is not None and rank not in self.lost and now - previous[1] > self.lost_after_s:
                self.lost[rank] = now
                events.append(RankLost(rank, previous[2], f"no heartbeat for {self.lost_after_s:g} s", time.time()))
        return events

    def _refusals(self) -> list[Event]:
        """One line per kind of refusal at the front when it grows, at most every REFUSALS_EVERY_S."""
        if self.stats is None:
            return []
        now, at = self.stats(), time.monotonic()
        out = []
        for what, words in REFUSALS.items():
            count, when = self.said.get(what, (0, -REFUSALS_EVERY_S))
            if now.get(what, 0) > count and at - when >= REFUSALS_EVERY_S:
                out.append(LogLine(FRONT, "warning", f"the job's front {words}: {now[what]} so far "
                                   "(docs/explanation/trust-model.md)", time.time()))
                self.said[what] = (now[what], at)
        return out


class LiveSource:
    """A Source over what a receiving thread (hub.Hub, hub.Subscriber) injects. `backlog` tells that thread to stop
    reading while the pipeline is MAX_BACKLOG events behind, so ZeroMQ's high-water marks hold the rest (and the
    ranks count what does not fit). `closer`: called by close, to hand on what is still in the sockets."""

    MAX_BACKLOG = 200_000

    def __init__(self, closer: Callable[[], None] | None = None):
        self._closer = closer
        self._lock = threading.Lock()
        self._events: list[Event] = []
        self.error: str | None = None

    @property
    def backlog(self) -> int:
        return len(self._events)

    def inject(self, events: list[Event]) -> None:
        if events:
            with self._lock:
                self._events.extend(events)

    def poll(self) -> list[Event]:
        with self._lock:
            out, self._events = self._events, []
        return out

    def close(self) -> None:
        if self._closer is not None:
            self._closer()
