"""The glossary as code: every number ddptop shows about steps and segments, defined once (pure, no torch).

The state reducer (screen), the headless printer, `info`, `report` and `export --csv` all call this module;
docs/reference/glossary.md says the same words (tests check that every term here appears there).
"""

from __future__ import annotations

import math
import statistics
from array import array
from dataclasses import dataclass, field, replace
from typing import Any, Iterable, Iterator, Mapping

from ddptop.config import IMAGE_DATASETS
from ddptop.events import ConfigApplied, Event, StepDone

SPAN_EVERY = 10  # a sampled step (per-layer spans) every 10th step by default
SPAN_RANKS = 160  # above this many ranks the default samples less often, so that the front decodes and records the
#                   spans of at most ~160 ranks' steps per 10 steps: at 1,024 ranks, 100 spans on every 10th step
#                   were half of what the front spent (benchmarks/collector_throughput.py, issue 41)


def span_cadence(span_every: int, world_size: int) -> int:
    """Every how many steps a rank records per-layer spans: `--span-every` when given (≥ 1), else every 10th step,
    or every (world size / 16)th above 160 ranks (every 64th at 1,024 ranks). The same on every rank: the ranks'
    sampled steps stay the same steps (the straggler analysis lines them up)."""
    if span_every:
        return span_every
    return max(SPAN_EVERY, -(-SPAN_EVERY * max(1, world_size) // SPAN_RANKS))


# name → (unit, definition). docs/reference/glossary.md is this table in prose.
GLOSSARY: dict[str, tuple[str, str]] = {
    "step time": ("s", "wall clock from one step boundary to the next on one rank: everything the training thread "
                       "does for that step, ddptop's own work included; a pause, a configuration switch, waiting at "
                       "the first boundary for every rank to start and the end-of-epoch test are not part of any "
                       "step"),
    "images/s": ("img/s", "images trained in a window of steps divided by the wall time of those steps; for the "
                          "job, every rank's images divided by the slowest rank's time; samples/s (the same count) "
                          "where the inputs are not images: the token set and the user's own data sets"),
    "tokens/s": ("tokens/s", "tokens trained in a window of steps divided by the wall time of those steps, counted "
                             "the same way as images/s, where the batches say how many tokens they hold: a dict "
                             "batch's attention_mask summed, or the user's own count (--tokens, job.step(tokens=)); "
                             "not shown where they say nothing"),
    "data": ("s", "waiting for the next batch and copying it to the device"),
    "compute": ("s", "forward (with the loss), backward and the optimizer step, from the step's phase marks; "
                     "under DDP the backward ends when the last bucket is launched; per-layer hook time is "
                     "left out; with accum K > 1 the K−1 micro-steps too"),
    "K−1 micro-steps": ("s", "with accum K > 1, the micro-steps before the synchronized one, with no sync: each "
                             "one's forward, backward and the loading of the batch after it, from the phase mark of "
                             "the first batch to the K-th batch's; part of compute, and taken out of forward, which "
                             "is the synchronized micro-step's (0 with accum 1)"),
    "communication": ("s", "time during which at least one collective (or DDP bucket) was in flight"),
    "exposed communication": ("s", "communication time during which no compute ran: what the step waited for"),
    "overlap": ("%", "share of communication time during which compute ran (HTA's definition)"),
    "ddptop": ("s", "time the training thread spent in ddptop's own code: the step-boundary exchange, marks, "
                    "comm-span bookkeeping, layer hooks on sampled steps, handing events to the publisher"),
    "other": ("s", "step time − data − compute − exposed communication − ddptop: Python and framework work "
                   "between phases (zero_grad, loop overhead)"),
    "sent/received": ("MB/step", "bytes the sync algorithm puts on the wire per rank and step: ring all-reduce "
                                 "2(N−1)/N·S each way; gather+scatter (N−1)·S in and out at rank 0, S at the "
                                 "others; single 0"),
    "NIC bytes": ("MB/step", "what the rank's network interface counted (the kernel's counters), per step: "
                             "between two samples taken between steps' traffic (in a forward pass), divided by "
                             "the steps that ended between them (ddptop.metrics.traffic)"),
    "warm-up": ("steps", "the first steps of each segment, left out of its figures (a sweep's warm-up, else 1: "
                         "the first step after a switch builds DDP buckets and caches)"),
    "sampled step": ("", "a step with per-layer spans (every --span-every steps: by default every 10th, or every (world size / 16)th above 160 ranks; never a segment's first); its "
                         "hooks slow it, so it is left out of time figures"),
    "busy time": ("s", "step time less exposed communication: the part of a step a rank spends on its own work, "
                       "not waiting for the others at a collective; a rank whose busy time shifts and stays shifted "
                       "while the others' does not is named (ddptop.metrics.changes)"),
    "slowest rank": ("", "the rank with the largest mean step time over the segment's measured steps"),
    "score": ("", "from 16 ranks (the screen's summary): the median rank's busy time over its last 10 steps divided "
                  "by this rank's; 1.00 a typical rank, 0.50 one twice as slow (ddptop.metrics.ranks.score)"),
    "time per epoch": ("s", "the slowest rank's mean step time × the steps of one epoch at the segment's batch "
                            "size (HPML Lab 4 Q1): projected from the measured steps, not a timed epoch"),
}

DEFAULT_WARMUP = 1


def rate_unit(dataset: Any) -> str:
    """`img/s` where a run's samples are images (the built-in image sets; a recording that names none), else
    `samples/s`: what the screen, headless lines, info, report and CSV call the images/s figure."""
    return "img/s" if dataset is None or dataset in IMAGE_DATASETS else "samples/s"


def rate(images: float, seconds: float) -> float:
    """Images (samples) over the wall time they took: the img/s of a window of steps (Window.figures), or of one
    step's row in steps.csv (a window of one); never a mean of such rates."""
    return images / seconds if seconds > 0 else 0.0


def rate_column(dataset: Any) -> str:
    """The images/s figure's CSV column: images_per_s, or samples_per_s (rate_unit)."""
    return "images_per_s" if rate_unit(dataset) == "img/s" else "samples_per_s"


def warmup_for(run_config: Mapping[str, Any] | None) -> int:
    """Steps left out at each segment's start: a sweep's own warm-up, else DEFAULT_WARMUP."""
    run_config = run_config or {}
    value = run_config.get("sweep_warmup") if run_config.get("sweep") else DEFAULT_WARMUP
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else DEFAULT_WARMUP


def step_start(d: StepDone) -> float:
    """Wall time of the step boundary that began `d`: its end less its step time and the time set aside inside it
    (a pause, a switch, the epoch's test: `iter_s` leaves them out). Steps recorded before `aside_s` was carried
    read 0 there and seem to start when their set-aside time ended."""
    return d.t - d.iter_s - d.aside_s


MICRO = "K−1 micro-steps, no sync"  # the part of a step with accum K > 1 (StepDone.micro_s)


def busy_s(d: StepDone) -> float:
    """Busy time: the step time less exposed communication, the part of a step the rank spends on its own work and
    not waiting for the others at a collective (metrics.changes: under DDP one slow rank stretches every rank's step
    time, but only its own busy time). Without probes (exposed communication 0) it is the step time."""
    return max(0.0, d.iter_s - d.exposed_comm_s)


def in_warmup(step: int, first: int, warmup: int) -> bool:
    """A step among the first `warmup` of the segment that began at step `first`: left out of its figures."""
    return step < first + warmup


def other_s(d: StepDone) -> float:
    """The part of a step no phase accounts for (never negative)."""
    return max(0.0, d.iter_s - d.data_s - d.compute_s - d.exposed_comm_s - d.own_s)


def parts(d: StepDone) -> dict[str, float]:
    """One step split into parts that add up to its step time (the screen's breakdown bar). A step recorded
    before compute was split by phase (older files: forward, backward, optimizer all 0) shows it as `compute`;
    with accum K > 1 the K−1 unsynchronized micro-steps are a part of their own (MICRO), run before forward."""
    if d.fwd_s + d.bwd_s + d.opt_s <= 0 < d.compute_s:
        return {"data": d.data_s, "compute": d.compute_s, "exposed comm": d.exposed_comm_s, "ddptop": d.own_s,
                "other": other_s(d)}
    micro = {MICRO: d.micro_s} if d.micro_s > 0 else {}  # accum 1 steps keep the parts they always had
    return {"data": d.data_s, **micro, "forward": d.fwd_s, "backward": d.bwd_s, "exposed comm": d.exposed_comm_s,
            "optimizer": d.opt_s, "ddptop": d.own_s, "other": other_s(d)}


def mean_parts(steps: Iterable[StepDone]) -> dict[str, float]:
    """`parts` averaged over steps (a window of one rank): still adds up to the mean step time."""
    steps = list(steps)
    out: dict[str, float] = {}
    for d in steps:
        for name, value in parts(d).items():
            out[name] = out.get(name, 0.0) + value / len(steps)
    return out


class _Sums:
    """Running sums over the steps of one rank in one window; `figures()` turns them into means."""

    __slots__ = ("steps", "time", "images", "tokens", "data", "compute", "micro", "comm", "exposed", "own", "threads",
                 "threaded", "other", "tx", "rx", "times", "loss", "sampled")

    def __init__(self) -> None:
        self.steps = 0
        self.time = self.images = self.tokens = self.data = self.compute = self.micro = self.comm = self.exposed = 0.0
        self.own = self.threads = self.other = 0.0
        self.tx = self.rx = 0
        self.threaded = 0  # steps that carry threads_s (0: not measured yet, or a file from before issue 42)
        self.times = array("d")
        self.loss = math.nan
        self.sampled = 0  # sampled steps among those counted (only when a window has nothing else)

    def add(self, d: StepDone) -> None:
        self.steps += 1
        self.time += d.iter_s
        self.images += d.batch_size
        self.tokens += d.tokens
        self.data += d.data_s
        self.compute += d.compute_s
        self.micro += d.micro_s
        self.comm += d.comm_s
        self.exposed += d.exposed_comm_s
        self.own += d.own_s
        self.threads += d.threads_s
        self.threaded += d.threads_s > 0
        self.other += other_s(d)
        self.tx += d.tx_bytes
        self.rx += d.rx_bytes
        self.times.append(d.iter_s)
        self.sampled += d.sampled

    def figures(self) -> "Figures":
        n = self.steps
        if n == 0:
            return Figures()
        mean = lambda total: total / n  # noqa: E731
        return Figures(
            steps=n, step_s=mean(self.time), median_step_s=statistics.median(self.times),
            step_sd_s=statistics.stdev(self.times) if n > 1 else 0.0,
            images_per_s=rate(self.images, self.time), data_s=mean(self.data),
            compute_s=mean(self.compute), micro_s=mean(self.micro), comm_s=mean(self.comm),
            exposed_comm_s=mean(self.exposed),
            overlap=(self.comm - self.exposed) / self.comm if self.comm > 0 else 0.0, own_s=mean(self.own),
            threads_s=self.threads / self.threaded if self.threaded else 0.0,
            other_s=mean(self.other), tx_bytes=mean(self.tx), rx_bytes=mean(self.rx), loss=self.loss,
            sampled=self.sampled, time_s=self.time, tokens_per_s=rate(self.tokens, self.time))


@dataclass(frozen=True)
class Figures:
    """One rank over a window of steps (or, in SegmentFigures.mean, the mean of the ranks' figures)."""

    steps: int = 0
    step_s: float = 0.0  # mean step time
    median_step_s: float = 0.0
    images_per_s: float = 0.0
    data_s: float = 0.0
    compute_s: float = 0.0
    micro_s: float = 0.0  # the K−1 micro-steps (accum > 1), inside compute_s
    comm_s: float = 0.0
    exposed_comm_s: float = 0.0
    overlap: float = 0.0  # communication-time weighted: hidden communication / communication, over the window
    own_s: float = 0.0
    threads_s: float = 0.0  # CPU ddptop's other threads spent per step (StepDone.threads_s): beside own_s, not in it
    other_s: float = 0.0
    tx_bytes: float = 0.0  # per step, by the algorithm's formula
    rx_bytes: float = 0.0
    loss: float = math.nan  # at the window's last step
    sampled: int = 0  # sampled steps counted (only where the window had no other steps)
    time_s: float = 0.0  # the window's wall time: the sum of its step times
    step_sd_s: float = 0.0  # the sample standard deviation of the window's step times (0 with fewer than 2)
    tokens_per_s: float = 0.0  # 0: the window's batches said no token count

    @property
    def step_se_s(self) -> float:
        """The standard error of the mean step time: how far another window of as many steps of the same
        configuration may land from this one by step-to-step noise alone (0 with fewer than 2 steps)."""
        return self.step_sd_s / math.sqrt(self.steps) if self.steps > 1 else 0.0

    @property
    def busy_s(self) -> float:
        """Mean busy time over the window: the mean step time less the mean exposed communication (busy_s's
        definition over a window; never negative)."""
        return max(0.0, self.step_s - self.exposed_comm_s)

    def share(self, seconds: float) -> float:
        """`seconds` as a fraction of the mean step time."""
        return seconds / self.step_s if self.step_s > 0 else 0.0


def job_images_per_s(figures: Iterable[Figures], per_s: str = "images_per_s") -> float:
    """The job's rate over per-rank windows: every rank's images / the slowest rank's wall time (`per_s`
    "tokens_per_s": its tokens)."""
    figures = [f for f in figures if f.steps]
    slowest = max((f.time_s for f in figures), default=0.0)
    return sum(getattr(f, per_s) * f.time_s for f in figures) / slowest if slowest > 0 else 0.0


def job_tokens_per_s(figures: Iterable[Figures]) -> float:
    """The job's tokens/s: every rank's tokens / the slowest rank's wall time (0: no batch said its tokens)."""
    return job_images_per_s(figures, "tokens_per_s")


def job_figures(figures: Iterable[Figures]) -> Figures:
    """The job over per-rank windows, as the segment table counts it: the slowest rank's figures (its mean step
    time is the job's) with the job's img/s (`job_images_per_s`)."""
    figures = [f for f in figures if f.steps]
    if not figures:
        return Figures()
    slowest = max(figures, key=lambda f: f.step_s)
    return replace(slowest, images_per_s=job_images_per_s(figures), tokens_per_s=job_tokens_per_s(figures))


def window(steps: Iterable[StepDone], include_sampled: bool = False) -> Figures:
    """Figures of one rank over `steps` (e.g. the last N): sampled steps are left out unless nothing else is."""
    steps = list(steps)
    chosen = steps if include_sampled else ([d for d in steps if not d.sampled] or steps)
    sums = _Sums()
    for d in chosen:
        sums.add(d)
    if steps:
        sums.loss = steps[-1].loss
    return sums.figures()


@dataclass(frozen=True)
class SegmentFigures:
    """One configuration segment: its measured steps per rank, its slowest rank, and the mean over ranks."""

    index: int
    first_step: int
    last_step: int
    config: Mapping[str, Any]
    warmup: int  # steps left out at the start
    ranks: Mapping[int, Figures]
    slowest_rank: int | None
    slowest: Figures
    mean: Figures
    images_per_s: float  # the job's: every rank's images / the slowest rank's window time
    final_loss: float  # mean over ranks of the loss at the segment's last step
    sampled_left_out: int  # sampled steps not counted in time figures (all ranks)
    switch_bytes: int = 0  # one-off bytes broadcast to re-synchronize the ranks when the segment started
    switch_s: float = 0.0  # one-off time the switch took (rebuild, broadcast, fingerprint), rank 0
    fingerprints: Mapping[int, str] = field(default_factory=dict)  # at the segment's start, per rank
    steps_per_epoch: int = 0  # at the segment's batch size (0: unknown, an older recording)
    tokens_per_s: float = 0.0  # the job's, as images_per_s (0: its batches said no token count)

    @property
    def measured_steps(self) -> int:
        return self.slowest.steps

    @property
    def epoch_s(self) -> float:
        """Time per epoch (see GLOSSARY); 0 when the steps per epoch are unknown."""
        return self.slowest.step_s * self.steps_per_epoch


class SegmentTable:
    """Per-segment figures, fed event by event (the live screen) or from a whole recording (info, report).

    Memory is a few sums per (segment, rank) plus one float per measured step (for medians)."""

    def __init__(self, warmup: int = DEFAULT_WARMUP):
        self.warmup = warmup
        self._starts: dict[int, tuple[int, dict, int, float, int]] = {}  # segment → (step, config, bytes, switch_s,
        #                                                                     steps per epoch)
        self._prints: dict[int, dict[int, str]] = {}
        self._first_seen: dict[int, int] = {}
        self._last: dict[int, int] = {}
        self._counted: dict[tuple[int, int], _Sums] = {}
        self._sampled: dict[tuple[int, int], _Sums] = {}  # sampled steps, counted only if nothing else is
        self._losses: dict[tuple[int, int], tuple[int, float]] = {}  # (segment, rank) → (step, loss), newest
        self._cache: dict[int, SegmentFigures] = {}  # figures of segments nothing arrived for since

    @classmethod
    def of(cls, events: Iterable[Event], warmup: int = DEFAULT_WARMUP) -> "SegmentTable":
        table = cls(warmup)
        table.apply_all(events)
        return table

    def apply_all(self, events: Iterable[Event]) -> None:
        for event in events:
            self.apply(event)

    def passing(self, events: Iterable[Event]) -> Iterator[Event]:
        """`events`, each applied here as it passes: one read of a recording's steps feeds this table and another
        reader (the report's statistics), where two reads decoded every row twice."""
        for event in events:
            self.apply(event)
            yield event

    def apply(self, event: Event) -> None:
        if isinstance(event, StepDone):
            self._cache.pop(event.segment, None)
            self._step(event)
        elif isinstance(event, ConfigApplied):
            self._cache.pop(event.segment, None)
            self._prints.setdefault(event.segment, {})[event.rank] = event.fingerprint
            if event.rank == 0 or event.segment not in self._starts:
                self._starts[event.segment] = (event.step, dict(event.config), event.sync_bytes, event.switch_s,
                                               event.steps_per_epoch)

    def _step(self, d: StepDone) -> None:
        seg = d.segment
        first = self._starts[seg][0] if seg in self._starts else self._first_seen.setdefault(seg, d.step)
        self._last[seg] = max(self._last.get(seg, d.step), d.step)
        key = (seg, d.rank)
        newest = self._losses.get(key)
        if newest is None or d.step >= newest[0]:
            self._losses[key] = (d.step, d.loss)
        if in_warmup(d.step, first, self.warmup):
            return
        (self._sampled if d.sampled else self._counted).setdefault(key, _Sums()).add(d)

    def first_step(self, seg: int) -> int | None:
        """The step a segment began at: its switch's, else the first step seen of it (None: nothing yet)."""
        start = self._starts.get(seg)
        return start[0] if start is not None else self._first_seen.get(seg)

    def final_loss(self, seg: int) -> float:
        """SegmentFigures.final_loss: the mean over ranks of the loss at the segment's last step (NaN before any);
        cheap on its own, for a reader that needs no more of the table (the Prometheus endpoint at each scrape)."""
        last = self._last.get(seg)
        final = [loss for (s, _), (step, loss) in self._losses.items() if s == seg and step == last]
        return statistics.fmean(final) if final else math.nan

    def segments(self) -> list[SegmentFigures]:
        out = []
        for seg in sorted(set(self._starts) | set(self._last)):
            if seg not in self._last:
                continue  # announced, no step yet
            if seg not in self._cache:
                self._cache[seg] = self._figures(seg)
            out.append(self._cache[seg])
        return out

    def _figures(self, seg: int) -> SegmentFigures:
        unknown = (self._first_seen.get(seg, 0), {}, 0, 0.0, 0)
        step0, config, nbytes, switch_s, per_epoch = self._starts.get(seg, unknown)
        ranks = sorted({r for s, r in self._losses if s == seg})
        per_rank: dict[int, Figures] = {}
        left_out = 0
        for rank in ranks:
            counted, sampled = self._counted.get((seg, rank)), self._sampled.get((seg, rank))
            sums = counted if counted is not None and counted.steps else sampled or _Sums()
            if sums is not sampled and sampled is not None:
                left_out += sampled.steps
            sums.loss = self._losses[(seg, rank)][1]
            per_rank[rank] = sums.figures()
        timed = {r: f for r, f in per_rank.items() if f.steps}
        slowest_rank = max(timed, key=lambda r: (timed[r].step_s, -r)) if timed else None
        slowest = timed[slowest_rank] if slowest_rank is not None else Figures()
        return SegmentFigures(
            index=seg, first_step=step0, last_step=self._last[seg], config=config, warmup=self.warmup,
            ranks=per_rank,
            slowest_rank=slowest_rank, slowest=slowest, mean=_mean_figures(list(timed.values())),
            images_per_s=job_images_per_s(timed.values()),
            final_loss=self.final_loss(seg), sampled_left_out=left_out,
            switch_bytes=nbytes, switch_s=switch_s, fingerprints=dict(self._prints.get(seg, {})),
            steps_per_epoch=per_epoch, tokens_per_s=job_tokens_per_s(timed.values()))


def _mean_figures(figures: list[Figures]) -> Figures:
    if not figures:
        return Figures()
    mean = lambda name: statistics.fmean(getattr(f, name) for f in figures)  # noqa: E731
    comm = sum(f.comm_s * f.steps for f in figures)
    exposed = sum(f.exposed_comm_s * f.steps for f in figures)
    return Figures(
        steps=round(mean("steps")), step_s=mean("step_s"), median_step_s=mean("median_step_s"),
        images_per_s=mean("images_per_s"), data_s=mean("data_s"), compute_s=mean("compute_s"),
        micro_s=mean("micro_s"), comm_s=mean("comm_s"), exposed_comm_s=mean("exposed_comm_s"),
        overlap=(comm - exposed) / comm if comm > 0 else 0.0, own_s=mean("own_s"), threads_s=mean("threads_s"),
        other_s=mean("other_s"),
        tx_bytes=mean("tx_bytes"), rx_bytes=mean("rx_bytes"), loss=mean("loss"), sampled=sum(f.sampled for f in figures),
        time_s=mean("time_s"), step_sd_s=mean("step_sd_s"), tokens_per_s=mean("tokens_per_s"))


def table_rows(segments: Iterable[SegmentFigures]) -> list[dict[str, Any]]:
    """The segment table every consumer prints (info, report, export, the screen), as plain values."""
    rows = []
    for s in segments:
        rows.append({
            "segment": s.index, "first_step": s.first_step, "last_step": s.last_step, "config": dict(s.config),
            "warmup": s.warmup, "measured_steps": s.measured_steps, "sampled_left_out": s.sampled_left_out,
            "slowest_rank": s.slowest_rank, "step_s_slowest": s.slowest.step_s,
            "median_step_s_slowest": s.slowest.median_step_s, "step_s_mean": s.mean.step_s,
            "images_per_s": s.images_per_s, "data_s": s.mean.data_s, "compute_s": s.mean.compute_s,
            "micro_s": s.mean.micro_s, "comm_s": s.mean.comm_s, "exposed_comm_s": s.mean.exposed_comm_s,
            "overlap": s.mean.overlap,
            "ddptop_s": s.mean.own_s, "ddptop_share": s.mean.share(s.mean.own_s),
            "ddptop_threads_s": s.mean.threads_s, "other_s": s.mean.other_s,
            "sent_mb": s.mean.tx_bytes / 1e6, "recv_mb": s.mean.rx_bytes / 1e6, "final_loss": s.final_loss,
            "switch_mb": s.switch_bytes / 1e6, "switch_s": s.switch_s, "steps_per_epoch": s.steps_per_epoch,
            "epoch_s": s.epoch_s, "tokens_per_s": s.tokens_per_s,
        })
    return rows
