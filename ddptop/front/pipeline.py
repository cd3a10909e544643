"""Provides the one front pipeline, composed in `compose`: source → derived events → feed → state and sinks.

    LiveSource | ReplaySource ─▶ Derived (lost ranks, fingerprints, shifts, alarms)  ─▶ Feed ─▶ SharedState ─▶ screen
                                                                                          └▶ sinks (recording,   └▶ printer
                                                                                                    attach's notes)

Local runs and `--rank 0` (front.supervisor), the torchrun/Slurm collector (front.collector), `ddptop attach` and
`ddptop replay` (front.replay) all call `compose`; nothing else builds a Feed or adds events to a stream.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Sequence

from ddptop.events import Event, RankBack, RankLost, RunFinished, Source
from ddptop.front.cost import FrontMeter
from ddptop.front.feed import Feed, PartlyDerived, SharedState, Sink
from ddptop.front.fingerprints import FingerprintCheck
from ddptop.metrics.changes import ChangePoints

LIVENESS_EVERY_S = 1.0  # heartbeats are read once a second: a rank is lost after lost_after_s (10 s), never sooner


class Derived:
    """The events the front adds to what the ranks sent, in one place, each RankLost once.

    - liveness: ranks whose heartbeat stopped (or came back), and a store someone is flooding (control.bus.Liveness);
    - job: local rank processes that died, and the supervision that ends the survivors (front.supervisor.LocalJob);
    - fingerprints: ranks that must hold one model and do not;
    - change points: a rank whose busy time per step shifted and stayed shifted, unlike the others' (RankShifted);
    - the front's own CPU time per job step, every few seconds (FrontCost; front.cost);
    - add(): events from other threads (the recorder's failure).
    A rank both processes and heartbeats say is lost (a local rank that died) is reported by whichever saw it first.
    """

    def __init__(self, world_size: int = 0, liveness: Any = None, job: Any = None, cost: bool = False):
        self.liveness, self.job = liveness, job
        self.fingerprints = FingerprintCheck(world_size) if world_size else None
        self.changes = ChangePoints() if world_size > 1 else None  # one rank has no others to be unlike
        self.cost = FrontMeter() if cost else None  # the job's front only: attach's CPU is the watcher's
        self._pending: list[Event] = []
        self._lock = threading.Lock()
        self._lost: set[int] = set()
        self._next_liveness = 0.0

    def add(self, events: list[Event]) -> None:
        """From any thread: the events go out with the next pump."""
        with self._lock:
            self._pending.extend(events)

    def __call__(self, events: list[Event]) -> list[Event]:
        """The events derived from this pump; when a part fails, PartlyDerived carries what the others derived: a
        RankLost the job hands out once must not go down with a heartbeat read that failed beside it."""
        with self._lock:
            out, self._pending = self._pending, []
        failure = None
        for part in (self._fingerprints, self._changes, self._cost, self._job_lost, self._job_check, self._liveness):
            try:
                out += part(events)
            except Exception as exc:  # each part on its own: the others' events still go out
                failure = failure or exc
        kept = self._once(out)
        if failure is not None:
            raise PartlyDerived(kept, failure) from failure
        return kept

    def _fingerprints(self, events: list[Event]) -> list[Event]:
        return self.fingerprints.check(events) if self.fingerprints is not None else []

    def _changes(self, events: list[Event]) -> list[Event]:
        return self.changes.apply_all(events) if self.changes is not None else []

    def _cost(self, events: list[Event]) -> list[Event]:
        return self.cost(events) if self.cost is not None else []

    def _job_lost(self, events: list[Event]) -> list[Event]:
        return self.job.lost_events() if self.job is not None else []

    def _job_check(self, events: list[Event]) -> list[Event]:
        if self.job is not None:
            self.job.check()
        return []

    def _liveness(self, events: list[Event]) -> list[Event]:
        if self.liveness is None:
            return []
        self.liveness.finished.update(e.rank for e in events if isinstance(e, RunFinished))
        if time.monotonic() < self._next_liveness:
            return []
        self._next_liveness = time.monotonic() + LIVENESS_EVERY_S
        return self.liveness.check()

    def _once(self, out: list[Event]) -> list[Event]:
        kept = []
        for e in out:
            if isinstance(e, RankBack):
                self._lost.discard(e.rank)
            elif isinstance(e, RankLost):
                if e.rank in self._lost:
                    continue
                self._lost.add(e.rank)
            kept.append(e)
        return kept


def compose(source: Source | None, *, world_size: int = 0, liveness: Any = None, job: Any = None,
            sinks: Sequence[Sink] = (), state: SharedState | None = None, alarm: Any = None, tuner: Any = None,
            front_cost: bool = False) -> Feed:
    """The front's pipeline over `source`: what every way of watching a job calls. A replay passes the source
    alone (its derived events were recorded); a live front passes the job's world size, its liveness watcher, the
    job it supervises, its recording, the alarm the recording raises when it fails and its tuner (front.tune), whose
    notes go out as derived events and which is closed before the feed's last drain, so its outcome is recorded.
    `front_cost`: this process is the job's front (not a watcher), whose CPU per step is measured (front.cost)."""
    derived = Derived(world_size, liveness, job, front_cost) if (world_size or liveness is not None or job is not None
                                                    or alarm is not None or tuner is not None) else None
    if alarm is not None:
        alarm.derived = derived
    feed = Feed(source, [*sinks, *([tuner] if tuner is not None else [])], state=state, derived=derived,
                before_drain=tuner.close if tuner is not None else None)
    if tuner is not None:
        tuner.state, tuner.derived = feed.state, derived
    return feed
