"""Provides Snapshot: everything the screens and the headless printer read, frozen, with derived figures."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from ddptop import metrics
from ddptop.events import FrontCost, ModelsDiverged, RunStarted, StepDone, SystemSample
from ddptop.metrics import Figures, SegmentFigures
from ddptop.metrics.cost import front_per_step
from ddptop.metrics.memory import RankMemory
from ddptop.state.advising import WhatIf
from ddptop.state.views import EvalPoint, RankView, Segment, SpanStore, UtilView
from ddptop.metrics.traffic import Traffic, measured_vs_expected

RECENT_STEPS = 10  # the window of "now" figures (header img/s, the ranks' rolling means)


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
    samples: Mapping[int, tuple[SystemSample, ...]] = field(default_factory=dict)  # recent, per rank
    straggler: str = ""  # metrics.stragglers' line over the recent sampled steps, when it names a rank
    whatif: WhatIf = field(default_factory=WhatIf)  # the what-if table from the segment in force, the switches' checks
    memory: tuple[RankMemory, ...] = ()  # each rank's memory by kind in the newest segment sampled (metrics.memory)
    front: tuple[FrontCost, ...] = ()  # the front process's latest CPU readings (front.cost), oldest first

    @property
    def config(self) -> Mapping:
        """The configuration in force (the newest segment's), else what the run started with."""
        if self.segments:
            return self.segments[-1].config
        r = self.run
        return {"strategy": r.strategy, "bucket_mb": r.bucket_mb, "async_op": r.async_op,
                "batch_size": r.batch_size, "lr": r.lr} if r else {}

    @property
    def front_s(self) -> float:
        """The front process's CPU time per job step over its latest readings (metrics.cost); 0.0: none yet."""
        return front_per_step(self.front)[0]

    @property
    def world_size(self) -> int:
        return self.run.world_size if self.run else len(self.ranks)

    @property
    def step(self) -> int:
        return max((r.step for r in self.ranks), default=0)

    @property
    def epoch(self) -> int:
        return max((r.last.epoch for r in self.ranks if r.last), default=0)

    @property
    def segment(self) -> int:
        """The index of the segment in force."""
        return self.segments[-1].index if self.segments else 0

    def recent(self, rank: int, steps: int = RECENT_STEPS) -> Figures:
        """One rank over its last `steps` steps (sampled steps left out), by ddptop.metrics' definitions."""
        key = ("_recent", rank, steps)
        cached = self.__dict__.get(key)
        if cached is None:
            cached = self.__dict__[key] = metrics.window(self.history.get(rank, ())[-steps:])
        return cached

    def recent_parts(self, rank: int, steps: int = RECENT_STEPS) -> dict[str, float]:
        """metrics.parts averaged over the same steps as `recent` (they add up to its mean step time)."""
        history = self.history.get(rank, ())[-steps:]
        return metrics.mean_parts([d for d in history if not d.sampled] or list(history))

    @property
    def running(self) -> tuple[int, ...]:
        """Ranks that are stepping or about to (not lost, not finished)."""
        return tuple(r.rank for r in self.ranks if r.state in ("running", "starting", "paused"))

    @property
    def images_per_s(self) -> float:
        """The job's images/s over every running rank's last RECENT_STEPS steps."""
        cached = self.__dict__.get("_rate")
        if cached is None:
            cached = self.__dict__["_rate"] = metrics.job_images_per_s(self.recent(r) for r in self.running)
        return cached

    @property
    def tokens_per_s(self) -> float:
        """The job's tokens/s over the same steps as images_per_s (0: the batches said no token count)."""
        cached = self.__dict__.get("_tokens")
        if cached is None:
            cached = self.__dict__["_tokens"] = metrics.job_tokens_per_s(self.recent(r) for r in self.running)
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

    @property
    def run_state(self) -> str:
        """starting, running, paused or finished: the one word the header and the overview show."""
        if self.finished:
            return "finished"
        if self.paused:
            return "paused"
        return "running" if any(r.last for r in self.ranks) else "starting"

    def traffic(self, rank: int) -> Traffic | None:
        """NIC bytes against the formulas over the rank's recent samples (ddptop.metrics.traffic)."""
        key = ("_traffic", rank)
        if key not in self.__dict__:
            self.__dict__[key] = measured_vs_expected(self.samples.get(rank, ()), self.history.get(rank, ()))
        return self.__dict__[key]

    @property
    def hints(self) -> tuple:
        """ddptop.metrics.hints for the segment in force (ddptop.state.hinting); computed once per snapshot."""
        if "_hints" not in self.__dict__:
            from ddptop.state.hinting import live_hints

            self.__dict__["_hints"] = live_hints(self)
        return self.__dict__["_hints"]

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

    def per_step(self, value, reduce=None) -> list[tuple[int, float]]:
        """(step, `reduce` (default: the mean) over ranks of `value(StepDone)`) for every step in the histories;
        sampled steps are left out (their layer hooks slow them)."""
        sums: dict[int, list[float]] = {}
        for points in self.history.values():
            for d in points:
                if not d.sampled:
                    sums.setdefault(d.step, []).append(value(d))
        reduce = reduce or (lambda v: sum(v) / len(v))
        return [(step, reduce(v)) for step, v in sorted(sums.items())]
