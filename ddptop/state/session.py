"""Provides SessionState: a reducer over the event stream that hands the screens frozen snapshots."""

from __future__ import annotations

import collections
import itertools
from dataclasses import replace
from typing import Iterable, Mapping

from ddptop import metrics
from ddptop.events import (ClockSync, ConfigApplied, ControlRefused, EpochDone, Event, EventsRefused, LogLine,
                           MemorySample, ModelsDiverged, OutOfMemory, RankBack, RankJoined, RankLost, RecorderFailed,
                           RunFinished, RunStarted, RunState, StepDone, StepSpans, StoreFlooded, SystemSample, TelemetryGap, TuneNote,
                           RankShifted, FrontCost)
from ddptop.metrics.energy import EnergyMeter
from ddptop.metrics.expected import expected_bytes
from ddptop.metrics.memory import MemoryTable
from ddptop.metrics.learning import RECENT_STEPS as LOSS_RECENT, START_STEPS as LOSS_START, loss_flag
from ddptop.metrics.stragglers import analyse
from ddptop.state.advising import Advisor
from ddptop.state.nodes import NodeTracker
from ddptop.state.notices import notice
from ddptop.state.snapshot import RECENT_STEPS, Snapshot  # noqa: F401  (Snapshot is the public result)
from ddptop.state.views import EvalPoint, RankView, Segment, SpanStore, UtilView

STEP_HISTORY = 2000  # steps kept per rank for the loss and iteration-time plots
SPAN_STEPS = 64  # sampled steps kept (all ranks together) for moving through the timeline
UTIL_HISTORY = 240  # system samples kept per rank (2 minutes at the sampler's 0.5 s)
NOTICES = 50
FRONT_READINGS = 5  # the front's CPU per step on screen: its last 5 readings (~10 s: front.cost.EVERY_S)
GPU_HISTORIES = {"gpu": "util_percent", "gpu_mem": "mem_used_bytes", "power": "power_w",  # UtilView name → GpuStat
                 "proc_gpu_mem": "proc_mem_bytes", "temp": "temp_c", "sm_clock": "sm_clock_mhz",
                 "pcie_rx": "pcie_rx_bytes_s", "pcie_tx": "pcie_tx_bytes_s", "nvlink_rx": "nvlink_rx_bytes_s",
                 "nvlink_tx": "nvlink_tx_bytes_s"}


class SessionState:
    """Reduces events into per-rank latest values and bounded histories. Not thread-safe: one owner."""

    def __init__(self) -> None:
        self.version = 0
        self.run: RunStarted | None = None
        self.ranks: dict[int, RankView] = {}
        self.segments: dict[int, Segment] = {}
        self.evals: dict[int, list[EpochDone]] = {}
        self.history: dict[int, collections.deque] = {}
        self.spans: collections.OrderedDict[tuple[int, int], StepSpans] = collections.OrderedDict()
        self.util: dict[int, dict[str, collections.deque]] = {}
        self.samples: dict[int, collections.deque] = {}  # SystemSample per rank: NIC bytes against the formulas
        self.energy: dict[int, EnergyMeter] = {}  # per rank: a few numbers, fed every step and sample
        self.nodes = NodeTracker()
        self.notices: collections.deque[str] = collections.deque(maxlen=NOTICES)
        self.paused = False
        self.t = 0.0
        self.table = metrics.SegmentTable()
        self.diverged: list[ModelsDiverged] = []
        self.refused = 0  # events refused at the door (EventsRefused): counted, never applied
        self.clock_syncs: list[ClockSync] = []  # rank 0's ping-pongs: the first (start) and the latest
        self._straggler: str | None = ""  # None: spans or clocks changed since it was found
        self.loss_start: dict[int, list[float]] = {}  # each rank's first losses, for metrics.learning.loss_flag
        self.loss_flag: str | None = None  # said once per job, as a notice
        self._snapshot: Snapshot | None = None
        self.memory = MemoryTable()  # each rank's memory by kind, per segment
        self.front: collections.deque[FrontCost] = collections.deque(maxlen=FRONT_READINGS)
        self.advisor = Advisor()  # the live what-if: refitted when its segment grows, not on every snapshot
        self._handlers = {RankJoined: self._joined, RunStarted: self._started, StepDone: self._step,
                          StepSpans: self._spans, SystemSample: self._system, EpochDone: self._epoch,
                          RunFinished: self._finished, ConfigApplied: self._config, ControlRefused: self._notice,
                          RankLost: self._lost, RunState: self._run_state, LogLine: self._notice,
                          ModelsDiverged: self._diverged, RankBack: self._back, TelemetryGap: self._notice,
                          RecorderFailed: self._notice, StoreFlooded: self._notice,
                          OutOfMemory: self._notice, EventsRefused: self._events_refused, ClockSync: self._clocks,
                          TuneNote: self._notice, MemorySample: self.memory.apply, RankShifted: self._notice,
                          FrontCost: self.front.append}

    def apply(self, event: Event) -> None:
        handler = self._handlers.get(type(event))
        if handler is None:
            return
        handler(event)
        self.t = max(self.t, getattr(event, "t", 0.0))
        self.version += 1

    def apply_all(self, events: Iterable[Event]) -> None:
        for event in events:
            self.apply(event)

    # -- handlers ------------------------------------------------------------------------------------------
    def _rank(self, rank: int) -> RankView:
        return self.ranks.get(rank) or RankView(rank)

    def _set(self, rank: int, **changes) -> None:
        self.ranks[rank] = replace(self._rank(rank), **changes)

    def _joined(self, e: RankJoined) -> None:
        self._set(e.rank, host=e.host, device=e.device, rank_source=e.rank_source)
        self.nodes.join(e.host, e.rank)

    def _started(self, e: RunStarted) -> None:
        self.run = e
        self.table.warmup = e.warmup

    def _step(self, e: StepDone) -> None:
        view = self._rank(e.rank)
        state = "running" if view.state in ("starting", "running") else view.state
        self._set(e.rank, last=e, state=state)
        history = self.history.setdefault(e.rank, collections.deque(maxlen=STEP_HISTORY))
        history.append(e)
        self._meter(e.rank).step(e)
        self.table.apply(e)
        self._check_loss(e.rank, history)

    def _check_loss(self, rank: int, history: collections.deque) -> None:
        first = self.loss_start.setdefault(rank, [])
        if len(first) < LOSS_START:
            first.append(history[-1].loss)
        if self.loss_flag is not None:
            return
        recent = [history[-i].loss for i in range(min(LOSS_RECENT, len(history)), 0, -1)]
        text = loss_flag(first, recent, history[-1].step + 1)
        if text:
            self.loss_flag = f"step {history[-1].step + 1}: rank {rank}'s {text}"
            self.notices.append(f"WARNING: {self.loss_flag}")

    def _spans(self, e: StepSpans) -> None:
        self.spans[(e.rank, e.step)] = e
        while len(self.spans) > SPAN_STEPS:
            self.spans.popitem(last=False)
        self._straggler = None

    def _clocks(self, e: ClockSync) -> None:
        self.clock_syncs = self.clock_syncs[:1] + [e]
        self._straggler = None

    def _meter(self, rank: int) -> EnergyMeter:
        meter = self.energy.get(rank)
        if meter is None:
            meter = self.energy[rank] = EnergyMeter(rank)
        return meter

    def _system(self, e: SystemSample) -> None:
        self._meter(e.rank).sample(e)
        self._set(e.rank, system=e, host=e.host if self._rank(e.rank).host == "?" else self._rank(e.rank).host)
        hist = self.util.setdefault(e.rank, {k: collections.deque(maxlen=UTIL_HISTORY)
                                             for k in ("cpu", "rss", *GPU_HISTORIES)})
        self.samples.setdefault(e.rank, collections.deque(maxlen=UTIL_HISTORY)).append(e)
        hist["cpu"].append(e.proc_cpu_percent)
        hist["rss"].append(float(e.proc_rss_bytes))
        gpu = e.gpus[0] if e.gpus else None
        if gpu is not None:
            for name, attr in GPU_HISTORIES.items():
                hist[name].append(float(getattr(gpu, attr) or 0))
        view = self.ranks[e.rank]
        self.nodes.sample(e, view.last.step + 1 if view.last else 0)

    def _epoch(self, e: EpochDone) -> None:
        reports = self.evals.setdefault(e.epoch, [])
        reports[:] = [r for r in reports if r.rank != e.rank] + [e]

    def _finished(self, e: RunFinished) -> None:
        reason = e.reason if e.reason in ("done", "stopped") else "error"
        self._set(e.rank, state=reason)
        if reason == "error":
            self.notices.append(f"rank {e.rank}: {e.reason}")

    def _config(self, e: ConfigApplied) -> None:
        self.table.apply(e)
        if e.rank != 0:
            return
        self.segments[e.segment] = Segment(e.segment, e.step, dict(e.config), e.who, e.t)
        self._notice(e)

    def _notice(self, e: Event, steps_done: int | None = None) -> None:
        text = notice(e, steps_done)
        if text:
            self.notices.append(text)

    def _lost(self, e: RankLost) -> None:
        steps = self._rank(e.rank).step if e.rank in self.ranks else None
        self._set(e.rank, state="lost")
        self._notice(e, steps or None)

    def _back(self, e: RankBack) -> None:
        if self._rank(e.rank).state == "lost":
            self._set(e.rank, state="running")
        self._notice(e)

    def _events_refused(self, e: EventsRefused) -> None:
        self.refused += e.count
        self._notice(e)

    def _run_state(self, e: RunState) -> None:
        view = self._rank(e.rank)
        if view.state in ("running", "paused", "starting"):
            self._set(e.rank, state="paused" if e.paused else "running")
        if e.rank == 0:
            self.paused = e.paused
        self._notice(e)

    def _diverged(self, e: ModelsDiverged) -> None:
        self.diverged.append(e)
        self._notice(e)

    # -- reads without a snapshot (the headless printer, once per line) ------------------------------------
    def window(self, rank: int, last_step: int | None = None, steps: int = RECENT_STEPS,
               segment: int | None = None) -> metrics.Figures:
        """metrics.window over a rank's last `steps` steps up to `last_step` (everything received when None), only
        those of `segment` when given (a headless line never mixes two configurations), less its warm-up steps
        unless nothing else is there (as the segment table counts)."""
        chosen: list[StepDone] = []
        for d in reversed(self.history.get(rank, ())):
            if last_step is None or d.step <= last_step:
                if segment is not None and d.segment != segment:
                    break
                chosen.append(d)
                if len(chosen) == steps:
                    break
        if segment is not None:
            measured_from = (self.table.first_step(segment) or 0) + self.table.warmup
            chosen = [d for d in chosen if d.step >= measured_from] or chosen
        return metrics.window(chosen[::-1])

    def rank_state(self, rank: int) -> str:
        return self._rank(rank).state

    # -- snapshot --------------------------------------------------------------------------------------------
    def snapshot(self) -> Snapshot:
        """The current state, frozen; the same object until another event is applied."""
        if self._snapshot is not None and self._snapshot.version == self.version and not self.advisor.due(
                self, self._snapshot.segment_figures):  # a refit put off (REFIT_S) is due even with no new event
            return self._snapshot
        config = self._current_config()
        table = tuple(self.table.segments())
        self._snapshot = Snapshot(
            version=self.version, run=self.run, ranks=self._rank_views(), segments=tuple(
                self.segments[k] for k in sorted(self.segments)), evals=self._eval_points(),
            history={r: tuple(d) for r, d in sorted(self.history.items())}, spans=SpanStore(dict(self.spans)),
            nodes=self.nodes.views(lambda rank: expected_bytes(self.run, config, rank)),
            util={r: UtilView(r, **{k: tuple(v) for k, v in h.items()}) for r, h in sorted(self.util.items())},
            notices=tuple(self.notices), paused=self.paused, t=self.t,
            segment_figures=table, diverged=tuple(self.diverged),
            samples={r: tuple(d) for r, d in sorted(self.samples.items())}, straggler=self._straggler_line(),
            whatif=self.advisor.view(self, table), memory=tuple(self.memory.rows(self.memory.latest_segment())),
            front=tuple(self.front))
        return self._snapshot

    def glance(self) -> tuple[Snapshot, float]:
        """(a light snapshot, the segment in force's loss) for a reader of the "now" figures alone, the Prometheus
        endpoint at each scrape: ranks, segments, nodes and each rank's last RECENT_STEPS steps (all that
        Snapshot.recent, images_per_s, step and config read), without what grows with the steps kept (histories,
        the segment table's medians and deviations, spans, the what-if): a full snapshot of 1,024 ranks x 300 steps
        took 0.6 s here, during which the feed (and so the recording) waits on the lock."""
        config = self._current_config()
        segments = tuple(self.segments[k] for k in sorted(self.segments))
        snap = Snapshot(
            version=self.version, run=self.run, ranks=self._rank_views(), segments=segments,
            history={r: tuple(itertools.islice(reversed(d), RECENT_STEPS))[::-1]
                     for r, d in sorted(self.history.items())},
            nodes=self.nodes.views(lambda rank: expected_bytes(self.run, config, rank)), paused=self.paused, t=self.t)
        return snap, self.table.final_loss(snap.segment)

    def _straggler_line(self) -> str:
        """metrics.stragglers over the kept sampled steps of the segment in force, when it names a rank ('' else)."""
        if self._straggler is None:
            segment = max(self.segments, default=0)
            spans = [e for e in self.spans.values() if e.segment == segment]
            verdict = analyse(spans, self.clock_syncs, self.run.world_size if self.run else len(self.ranks),
                              {r: v.host for r, v in self.ranks.items()})[None]
            self._straggler = verdict.describe() if verdict.rank is not None else ""
        return self._straggler

    def _current_config(self) -> Mapping:
        if self.segments:
            return self.segments[max(self.segments)].config
        return Snapshot(run=self.run).config

    def _rank_views(self) -> tuple[RankView, ...]:
        views = [self.ranks[r] for r in sorted(self.ranks)]
        running = [v for v in views if v.state == "running" and v.last]
        slowest = max(running, key=lambda v: v.last.iter_s).rank if len(running) > 1 else None
        return tuple(replace(v, slowest=v.rank == slowest, energy=self._meter(v.rank).figures()) for v in views)

    def _eval_points(self) -> tuple[EvalPoint, ...]:
        points = []
        for epoch in sorted(self.evals):
            reports = self.evals[epoch]
            total = sum(r.total for r in reports)
            loss = sum(r.test_loss * r.total for r in reports) / total if total else 0.0
            points.append(EvalPoint(epoch, max(r.step for r in reports), loss, sum(r.correct for r in reports), total))
        return tuple(points)
