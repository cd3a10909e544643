"""Provides Feed, the pump of the front pipeline: every event, once and in order, to the SharedState and the sinks.

    source ─▶ (derived events) ─▶ Feed ─▶ SharedState (SessionState) ─▶ listeners (headless printer), snapshots (screen)
                                      └▶ sinks (the recording)

front.pipeline.compose builds it (nothing else does). Live, it runs on a thread of its own, so a slow terminal
or a redraw never delays the recording; over a replay the screen drives it from its timer (seeks happen between
two pumps, never inside one).
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any, Callable, Protocol, Sequence

from ddptop.events import FRONT, Event, LogLine, Source
from ddptop.state.session import SessionState, Snapshot

POLL_S = 0.2  # the collector thread polls the store every 0.2 s too: events never wait longer than that twice
MAX_SAID = 20  # distinct failures said as they happen; more are only counted (one bug, varying messages)


class Sink(Protocol):
    def handle(self, events: list[Event]) -> None: ...


class SharedState:
    """The one SessionState of a front, behind a lock: the feed applies events, readers take frozen snapshots.

    Listeners (the headless printer) get each event right after it is applied, so what they read is the state as
    of that event, however the events were batched (a live run and its replay print the same lines)."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self.state = SessionState()
        self.listeners: list[Callable[[list[Event]], None]] = []

    def handle(self, events: list[Event]) -> None:
        with self._lock:
            if not self.listeners:
                self.state.apply_all(events)
                return
            for event in events:
                self.state.apply(event)
                for listener in self.listeners:
                    listener([event])

    def reset(self) -> None:
        """A replay seeked: what comes next is the history up to the new position."""
        with self._lock:
            self.state = SessionState()

    def snapshot(self) -> Snapshot:
        with self._lock:
            return self.state.snapshot()

    def glance(self) -> tuple[Snapshot, float]:
        """SessionState.glance: the "now" figures, at a cost that does not grow with the steps kept."""
        with self._lock:
            return self.state.glance()


class PartlyDerived(Exception):
    """A part of the front's derived events failed (the heartbeats' store went away); `events` are what the other
    parts derived in the same pump, which go out all the same (a dead rank's RankLost is handed out only once)."""

    def __init__(self, events: list[Event], cause: Exception):
        super().__init__(f"{type(cause).__name__}: {cause}")
        self.events = events


class Feed:
    """source → SharedState and sinks, in order, each event once. `derived` (front.pipeline.Derived) adds the
    front's own events (lost ranks, fingerprint checks, recorder alarms) after each poll."""

    def __init__(self, source: Source | None, sinks: Sequence[Sink] = (), state: SharedState | None = None,
                 derived: Callable[[list[Event]], list[Event]] | None = None, interval_s: float = POLL_S,
                 before_drain: Callable[[], None] | None = None):
        self.source, self.derived, self.interval_s = source, derived, interval_s
        self.before_drain = before_drain  # the tuner's close: what it still adds to `derived` goes out in the drain
        self.state = state or SharedState()
        self.sinks = list(sinks)
        self.error: str | None = None  # the first sink failure (each distinct one is said as it happens)
        self.errors = 0  # sink failures in all; the feed goes on after each
        self._said: set[str] = set()
        self._source_errors: set[str] = set()  # the source's failures already turned into a LogLine
        self._generation = getattr(source, "generation", 0)
        self._lock = threading.RLock()
        self._halt = threading.Event()
        self._thread: threading.Thread | None = None
        self._closed = False

    @property
    def threaded(self) -> bool:
        return self._thread is not None

    def start(self) -> "Feed":
        """Pump on a thread of its own until `stop()`."""
        self._thread = threading.Thread(target=self._run, name="ddptop-feed", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._halt.wait(self.interval_s):
            self.pump()

    def pump(self) -> int:
        """One poll of the source (and the job's lost ranks) to every sink; returns how many events came."""
        with self._lock:
            if self.source is None or self._closed:
                return 0
            events = self._derive(self.source.poll() + self._source_failed())
            generation = getattr(self.source, "generation", 0)
            if generation != self._generation:  # a seek: this poll starts with the history up to the new position
                self._generation = generation
                self.state.reset()
            self.push(events)
            return len(events)

    def push(self, events: list[Event]) -> None:
        """Events that did not come from the source (a recording read at once, a test) go the same way."""
        with self._lock:
            for sink in (self.state, *self.sinks):
                try:
                    sink.handle(events)
                except Exception as exc:  # a bug in one sink must not starve the others (the recording above all)
                    self._sink_failed(f"{type(sink).__name__}: {type(exc).__name__}: {exc}")

    def _sink_failed(self, what: str) -> None:
        """Count it; say each distinct failure on stderr when it happens (under the screen Textual captures stderr)."""
        self.errors += 1
        if self.error is None:
            self.error = what
        if what not in self._said and len(self._said) < MAX_SAID:
            self._said.add(what)
            print(f"ddptop: while showing the run: {what} (going on)", file=sys.stderr, flush=True)

    def _source_failed(self) -> list[Event]:
        """A live source whose collector fails delivers nothing more, and the screen would freeze without a word:
        each distinct failure becomes one LogLine, which the screen, the headless printer and the recording get."""
        error = getattr(self.source, "error", None)
        if not error or error in self._source_errors or len(self._source_errors) >= MAX_SAID:
            return []
        self._source_errors.add(error)
        return [LogLine(FRONT, "error", f"receiving the ranks' telemetry failed: {error}",
                        time.time())]

    def control(self, fn: Callable[[], Any]) -> Any:
        """Run `fn` (a replay's seek, speed, play) between two pumps."""
        with self._lock:
            return fn()

    def snapshot(self) -> Snapshot:
        return self.state.snapshot()

    def stop(self) -> None:
        """Stop the thread, close the source and hand the last events on: nothing the ranks sent is lost."""
        self._halt.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=10)
        with self._lock:
            if self._closed:
                return
        if self.before_drain is not None:  # outside the lock: what it waits for may push through this feed
            self.before_drain()
        with self._lock:
            if self._closed:
                return
            if self.source is not None:
                self.source.close()
                self.pump_closed()
            self._closed = True
        if self.error:
            more = f" ({self.errors} failures in all)" if self.errors > 1 else ""
            print(f"ddptop: while showing the run: {self.error}{more}", file=sys.stderr)

    def pump_closed(self) -> None:
        """The drain after close: LiveSource.close() collects once more; poll returns what that found."""
        self.push(self._derive(self.source.poll() + self._source_failed() if self.source is not None else []))

    def _derive(self, events: list[Event]) -> list[Event]:
        if self.derived is None:
            return events
        try:
            return events + self.derived(events)
        except PartlyDerived as exc:
            self._sink_failed(f"derived events: {exc}")
            return events + exc.events
        except Exception as exc:  # the store went away while heartbeats were read: the ranks' events still go on
            self._sink_failed(f"derived events: {type(exc).__name__}: {exc}")
            return events

