"""Provides SessionState: a reducer over the event stream that hands the screens frozen snapshots."""

from __future__ import annotations

import collections
from dataclasses import dataclass, field, replace
from typing import Iterable, Mapping

from ddptop.control.commands import ConfigApplied, ControlRefused, RankLost, RunState
from ddptop import metrics
from ddptop.events import (EpochDone, Event, LogLine, ModelsDiverged, OutOfMemory, RankJoined, RunFinished, RunStarted,
                           StepDone, StepSpans, SystemSample)
from ddptop.metrics import Figures, SegmentFigures
from ddptop.state.expected import expected_bytes
from ddptop.state.nodes import NodeTracker
from ddptop.state.views import EvalPoint, RankView, Segment, SpanStore, UtilView

STEP_HISTORY = 2000  # steps kept per rank for the loss and iteration-time plots
RECENT_STEPS = 10  # the window of "now" figures (header img/s, the ranks' rolling means)
SPAN_STEPS = 64  # sampled steps kept (all ranks together) for moving through the timeline
UTIL_HISTORY = 240  # system samples kept per rank (2 minutes at the sampler's 0.5 s)
NOTICES = 50
GPU_HISTORIES = {"gpu": "util_percent", "gpu_mem": "mem_used_bytes", "power": "power_w",  # UtilView name → GpuStat
                 "proc_gpu_mem": "proc_mem_bytes", "temp": "temp_c", "sm_clock": "sm_clock_mhz",
                 "pcie_rx": "pcie_rx_bytes_s", "pcie_tx": "pcie_tx_bytes_s", "nvlink_rx": "nvlink_rx_bytes_s",
                 "nvlink_tx": "nvlink_tx_bytes_s"}


@dataclass(frozen=True, eq=False)
class Snapshot:
    """Everything the screens draw, frozen: safe to hand to any widget; compared by identity (and `version`)."""

    version: int = 0
    run: RunStarted | None = None
    ranks: tuple[RankView, ...] = ()
    segments: tuple[Segment, ...] = ()
    evals: tuple[EvalPoint, ...] = ()
    history: Mapping[int, tuple[StepDone, ...]] = field(default_factory=dict)
    spans: SpanStore = field(default_factory=SpanStore)
    nodes: tuple = ()
    util: Mapping[int, UtilView] = field(default_factory=dict)
    notices: tuple[str, ...] = ()
    paused: bool = False
    t: float = 0.0  # time of the newest event
    segment_figures: tuple[SegmentFigures, ...] = ()  # the per-segment table (ddptop.metrics), all steps so far
    diverged: tuple[ModelsDiverged, ...] = ()  # points where ranks that must hold one model did not

    @property
    def config(self) -> Mapping:
        """The configuration in force (the newest segment's), else what the run started with."""
        if self.segments:
            return self.segments[-1].config
        r = self.run
        return {"strategy": r.strategy, "bucket_mb": r.bucket_mb, "async_op": r.async_op,
                "batch_size": r.batch_size, "lr": r.lr} if r else {}

    @property
    def world_size(self) -> int:
        return self.run.world_size if self.run else len(self.ranks)

    @property
    def step(self) -> int:
        return max((r.step for r in self.ranks), default=0)

    @property
    def epoch(self) -> int:
        return max((r.last.epoch for r in self.ranks if r.last), default=0)

    def recent(self, rank: int, steps: int = RECENT_STEPS) -> Figures:
        """One rank over its last `steps` steps (sampled steps left out), by ddptop.metrics' definitions."""
        history = self.history.get(rank, ())
        return metrics.window(history[-steps:])

    @property
    def images_per_s(self) -> float:
        """The job's images/s over every running rank's last RECENT_STEPS steps."""
        cached = self.__dict__.get("_rate")
        if cached is None:
            live = [r.rank for r in self.ranks if r.state in ("running", "starting")]
            cached = self.__dict__["_rate"] = metrics.job_images_per_s(self.recent(r) for r in live)
        return cached

    @property
    def hosts(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(r.host for r in self.ranks if r.host != "?"))

    @property
    def rank_source(self) -> str:
        return next((r.rank_source for r in self.ranks if r.rank_source != "?"), "?")

    @property
    def finished(self) -> bool:
        return bool(self.ranks) and all(r.state in ("done", "stopped", "error", "lost") for r in self.ranks)

    def mean_loss(self) -> list[tuple[int, float]]:
        """(step, mean loss over the ranks that reported that step); computed once per snapshot."""
        cached = self.__dict__.get("_mean_loss")
        if cached is None:
            sums: dict[int, list[float]] = {}
            for points in self.history.values():
                for d in points:
                    sums.setdefault(d.step, []).append(d.loss)
            cached = self.__dict__["_mean_loss"] = [(step, sum(v) / len(v)) for step, v in sorted(sums.items())]
        return cached


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
        self.nodes = NodeTracker()
        self.notices: collections.deque[str] = collections.deque(maxlen=NOTICES)
        self.paused = False
        self.t = 0.0
        self.table = metrics.SegmentTable()
        self.diverged: list[ModelsDiverged] = []
        self._snapshot: Snapshot | None = None
        self._handlers = {RankJoined: self._joined, RunStarted: self._started, StepDone: self._step,
                          StepSpans: self._spans, SystemSample: self._system, EpochDone: self._epoch,
                          RunFinished: self._finished, ConfigApplied: self._config, ControlRefused: self._refused,
                          RankLost: self._lost, RunState: self._run_state, LogLine: self._log,
                          ModelsDiverged: self._diverged, OutOfMemory: self._out_of_memory}

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
        self.history.setdefault(e.rank, collections.deque(maxlen=STEP_HISTORY)).append(e)
        self.table.apply(e)

    def _spans(self, e: StepSpans) -> None:
        self.spans[(e.rank, e.step)] = e
        while len(self.spans) > SPAN_STEPS:
            self.spans.popitem(last=False)

    def _system(self, e: SystemSample) -> None:
        self._set(e.rank, system=e, host=e.host if self._rank(e.rank).host == "?" else self._rank(e.rank).host)
        hist = self.util.setdefault(e.rank, {k: collections.deque(maxlen=UTIL_HISTORY)
                                             for k in ("cpu", "rss", *GPU_HISTORIES)})
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
        if e.who != "start":
            self.notices.append(f"step {e.step}: now {self.segments[e.segment].label()} (segment {e.segment}, "
                                f"asked by {e.who})")

    def _refused(self, e: ControlRefused) -> None:
        self.notices.append(f"request {e.request_id} refused: {e.reason}")

    def _lost(self, e: RankLost) -> None:
        self._set(e.rank, state="lost")
        self.notices.append(f"rank {e.rank} lost: {e.reason}")

    def _run_state(self, e: RunState) -> None:
        view = self._rank(e.rank)
        if view.state in ("running", "paused", "starting"):
            self._set(e.rank, state="paused" if e.paused else "running")
        if e.rank == 0:
            self.paused = e.paused
            self.notices.append(f"step {e.step}: {'paused' if e.paused else 'resumed'}")

    def _log(self, e: LogLine) -> None:
        self.notices.append(f"rank {e.rank} {e.level}: {e.message}")

    def _out_of_memory(self, e: OutOfMemory) -> None:
        self.notices.append(f"step {e.step}: {e.describe()}")

    def _diverged(self, e: ModelsDiverged) -> None:
        self.diverged.append(e)
        self.notices.append(f"WARNING {e.describe()}")

    # -- snapshot --------------------------------------------------------------------------------------------
    def snapshot(self) -> Snapshot:
        """The current state, frozen; the same object until another event is applied."""
        if self._snapshot is not None and self._snapshot.version == self.version:
            return self._snapshot
        config = self._current_config()
        self._snapshot = Snapshot(
            version=self.version, run=self.run, ranks=self._rank_views(), segments=tuple(
                self.segments[k] for k in sorted(self.segments)), evals=self._eval_points(),
            history={r: tuple(d) for r, d in sorted(self.history.items())}, spans=SpanStore(dict(self.spans)),
            nodes=self.nodes.views(lambda rank: expected_bytes(self.run, config, rank)),
            util={r: UtilView(r, **{k: tuple(v) for k, v in h.items()}) for r, h in sorted(self.util.items())},
            notices=tuple(self.notices), paused=self.paused, t=self.t,
            segment_figures=tuple(self.table.segments()), diverged=tuple(self.diverged))
        return self._snapshot

    def _current_config(self) -> Mapping:
        if self.segments:
            return self.segments[max(self.segments)].config
        return Snapshot(run=self.run).config

    def _rank_views(self) -> tuple[RankView, ...]:
        views = [self.ranks[r] for r in sorted(self.ranks)]
        running = [v for v in views if v.state == "running" and v.last]
        slowest = max(running, key=lambda v: v.last.iter_s).rank if len(running) > 1 else None
        return tuple(replace(v, slowest=v.rank == slowest) for v in views)

    def _eval_points(self) -> tuple[EvalPoint, ...]:
        points = []
        for epoch in sorted(self.evals):
            reports = self.evals[epoch]
            total = sum(r.total for r in reports)
            loss = sum(r.test_loss * r.total for r in reports) / total if total else 0.0
            points.append(EvalPoint(epoch, max(r.step for r in reports), loss, sum(r.correct for r in reports), total))
        return tuple(points)
