"""Per-segment statistics from a recording's events (pure: no plotting, no torch).

The step, time, byte and loss figures are ddptop.metrics' (the numbers `info`, `export --csv` and the screen
show); this module adds what only a report needs: the spread of step times, the parts of a step, per-rank CPU,
memory and NIC bytes, GPU readings, test accuracy and the ring all-reduce bus bandwidth.
"""

from __future__ import annotations

import bisect
import dataclasses
import math
import statistics
from array import array
from dataclasses import dataclass, field
from typing import Iterable

from ddptop import metrics
from ddptop.config import SyncConfig
from ddptop.errors import RecordingError, UsageError
from ddptop.events import ConfigApplied, EpochDone, Event, FrontCost, RankJoined, RunStarted, StepDone, SystemSample
from ddptop.metrics import wire
from ddptop.metrics.cost import front_per_step
from ddptop.metrics.traffic import StepRun
from ddptop.report.readings import GpuRow, LinkStats, RankStats, gpus, links, quantile, rank_stats

# metrics.parts' keys, and "compute" for steps recorded before compute was split into forward, backward, optimizer
PARTS = ("data", "compute", metrics.MICRO, "forward", "backward", "exposed comm", "optimizer", "ddptop", "other")


@dataclass(frozen=True)
class SegmentStats:
    """One configuration segment of one run, measured steps only (warm-up and sampled steps left out)."""

    label: str  # the run's label (several recordings in one report)
    index: int
    config: SyncConfig
    world_size: int
    first_step: int
    measured_steps: int
    mean_step_s: float  # the slowest rank's mean step time
    median_step_s: float  # the slowest rank's median
    images_per_s: float  # the whole job's: every rank's images / the slowest rank's time
    compute_s: float
    comm_s: float
    exposed_comm_s: float
    overlap: float
    sent_mb_per_step: float  # by the ring/gather formulas (mean over ranks)
    recv_mb_per_step: float
    nic_sent_mb_per_step: float | None  # what the NICs counted; None on loopback, where ranks share counters
    nic_recv_mb_per_step: float | None
    cpu_percent: float | None  # the rank processes' CPU, mean over ranks and samples
    rss_mb: float | None
    final_loss: float
    allreduce_gbps: float | None  # ring all-reduce bus bandwidth: 2(N−1)/N·S / comm time (HPML Lab 4 Q3.2)
    losses: list[tuple[int, float]] = field(default_factory=list)  # (step, mean loss over ranks): first, last step
    mean_rank_step_s: float = 0.0  # the mean over ranks of their mean step time (mean_step_s: the slowest rank's)
    own_s: float = 0.0  # ddptop's own time per step
    threads_s: float = 0.0  # CPU ddptop's other threads spent per step (0: a file from before it was measured)
    front_s: float = 0.0  # CPU the front process spent per job step (metrics.cost; 0: none recorded)
    micro_s: float = 0.0  # the K−1 micro-steps (accum > 1), inside compute_s
    other_s: float = 0.0
    last_step: int = 0
    warmup: int = 0
    slowest_rank: int | None = None
    step_p10: float = math.nan  # the slowest rank's measured steps
    step_p90: float = math.nan
    parts: dict = field(default_factory=dict)  # PARTS → seconds per step, mean over ranks
    ranks: tuple[RankStats, ...] = ()
    t0: float = 0.0  # wall clock: the first measured step's start, the segment's last step's end
    t1: float = 0.0
    seg_t0: float = 0.0  # wall clock: the segment's first step's start (warm-up included)
    gpus: tuple[GpuRow, ...] = ()
    evals: tuple[tuple[int, float, float], ...] = ()  # (step, test accuracy, test loss) at epoch ends inside
    buckets_mb: tuple[float, ...] = ()  # DDP bucket sizes, launch order
    links: tuple[LinkStats, ...] = ()  # what each network interface counted per step
    param_bytes: int = 0
    own_recorded: bool = True  # False for files from before ddptop's own cost was measured (shown as –)
    tokens_per_s: float = 0.0  # the whole job's, as images_per_s (0: the batches said no token count)

    @property
    def name(self) -> str:
        return f"{self.label} {self.config.describe()}".strip()

    @property
    def length(self) -> int:
        """Steps the segment ran (warm-up included)."""
        return self.last_step - self.first_step + 1

    @property
    def bus_gbit_s(self) -> float | None:
        """The all-reduce bus bandwidth in Gbit/s, the unit links are rated in: report.md, lab.md and HPML's
        table 3 all say it this way (issue 26: GB/s beside Gbit/s read as two different numbers)."""
        return None if self.allreduce_gbps is None else self.allreduce_gbps * 8


def sync_config(config: dict) -> SyncConfig:
    """A segment's configuration as the recording gives it (unknown keys ignored; bad values are damage)."""
    known = {f.name for f in dataclasses.fields(SyncConfig)}
    given = {k: v for k, v in config.items() if k in known}
    if given.get("strategy", "ddp") != "allreduce":
        given["async_op"] = False  # files from before async_op was cleared on leaving allreduce carry it along
    try:
        return SyncConfig(**given)
    except UsageError as exc:
        raise RecordingError(f"a segment's configuration in the recording is damaged: {exc}") from None


def _mean(values: list[float]) -> float:
    return statistics.fmean(values) if values else 0.0


def segment_stats(events: Iterable[Event], label: str = "", warmup: int | None = None,
                  run_config: dict | None = None, buckets: dict | None = None,
                  steps: Iterable[StepDone] | None = None,
                  table: metrics.SegmentTable | None = None) -> list[SegmentStats]:
    """Statistics of every segment with at least one step: the figures of ddptop.metrics plus what only a report
    adds. `warmup` steps at each segment's start are not measured (default: metrics.warmup_for the run).

    `steps`: the run's StepDone in recorded order, read once as they come (default: those among `events`, the
    rest of the run). Memory is a few sums per segment and rank, one float per measured step (medians, p10–p90)
    and a few steps per NIC reading (`_Wire`), never every step: 10^6 step rows take ~70 MB.

    `table`: the segment table to fill, its switches applied, at this `warmup` (Recording.segment_table): the
    caller reads its segments() after, from the same read of the steps (default: one of its own)."""
    warmup = metrics.warmup_for(run_config) if warmup is None else warmup
    events = events if isinstance(events, list) else list(events)
    started = next((e for e in events if isinstance(e, RunStarted)), None)
    hosts = {e.rank: e.host for e in events if isinstance(e, RankJoined)}
    samples = [e for e in events if isinstance(e, SystemSample)]
    front = tuple(e for e in events if isinstance(e, FrontCost))
    evals = test_accuracy(events)
    # switches first, as `info` reads a file: a segment's first step is known before its steps arrive
    if table is None:
        table = metrics.SegmentTable.of((e for e in events if isinstance(e, ConfigApplied)), warmup)
    elif table.warmup != warmup:
        raise ValueError(f"a segment table at warm-up {table.warmup} cannot count at {warmup}")
    readings = _nic_readings(samples)
    segments: dict[int, _Segment] = {}
    ranks: set[int] = set()
    for d in (e for e in events if isinstance(e, StepDone)) if steps is None else steps:
        table.apply(d)
        ranks.add(d.rank)
        seg = segments.get(d.segment) or segments.setdefault(d.segment, _Segment())
        seg.add(d, table.first_step(d.segment) + warmup, readings)
    world = started.world_size if started else len(ranks) or 1
    param_bytes = started.param_bytes if started else 0
    out = []
    for fig in table.segments():
        if not fig.slowest.steps:
            continue
        context = _Context(world, param_bytes, hosts, samples, evals, (buckets or {}).get(str(fig.index)), front)
        out.append(_stats(label, fig, segments[fig.index], context))
    return out


def rounds_spread(stats: list[SegmentStats]) -> tuple[float, str] | None:
    """The largest difference between the rounds of one configuration, as a share of its mean step time (and
    which configuration): how far apart the same measurement lands twice. None with no repeated configuration."""
    groups: dict[str, list[float]] = {}
    for s in stats:
        groups.setdefault(s.name, []).append(s.mean_step_s)
    spreads = [((max(v) - min(v)) / statistics.fmean(v), name) for name, v in groups.items()
               if len(v) > 1 and statistics.fmean(v) > 0]
    return max(spreads) if spreads else None


def pooled(same: list[SegmentStats], name: str) -> float:
    """A figure of segments that ran one configuration (a sweep repeated in rounds), as one: their means weighted
    by measured steps, so every measured step counts once."""
    weights = [s.measured_steps or 1 for s in same]
    return sum(getattr(s, name) * w for s, w in zip(same, weights)) / sum(weights)


def _nic_readings(samples: list[SystemSample]) -> dict[int, list[float]]:
    """Per rank, when its job interface was read, in time order."""
    out: dict[int, list[float]] = {}
    for s in samples:
        if s.nic() is not None:
            out.setdefault(s.rank, []).append(s.t)
    return {rank: sorted(times) for rank, times in out.items()}


class _Measured:
    """The steps metrics counts for one rank in one segment, as sums: how many, the earliest start, the parts
    (summed in recorded order) and every step time (p10–p90)."""

    __slots__ = ("n", "start", "parts", "times")

    def __init__(self) -> None:
        self.n, self.start, self.parts, self.times = 0, math.inf, dict.fromkeys(PARTS, 0.0), array("d")

    def add(self, d: StepDone) -> None:
        self.n += 1
        self.start = min(self.start, metrics.step_start(d))
        for name, value in _split(d).items():
            self.parts[name] += value
        self.times.append(d.iter_s)


class _Wire:
    """A rank's steps after the warm-up as metrics.traffic.measured_vs_expected needs them, given when the rank's
    NIC was read: whole where a reading falls in a step (its `between_steps` test reads the step) and the last one
    before each reading (a reading between two steps finds that one); every other run of steps between two
    readings as one StepRun (its end, count and bytes: all the check reads of them). The result is the same as on
    every step (test_report_memory checks) and memory is a few items per reading, not per step."""

    __slots__ = ("readings", "items", "run", "last")

    def __init__(self, readings: list[float]) -> None:
        self.readings = readings
        self.items: list[StepDone | StepRun] = []
        self.run: list | None = None  # [rank, first start, last end, steps, tx bytes, rx bytes]
        self.last: tuple[int, StepDone] | None = None  # (readings before its end, step): the newest, whole

    def add(self, d: StepDone) -> None:
        start = metrics.step_start(d)
        ahead = bisect.bisect_right(self.readings, d.t)
        free = bisect.bisect_left(self.readings, start) == ahead  # no reading from its start to its end
        if free and self.last is not None and self.last[0] == ahead and d.t >= self.last[1].t:
            self._join(self.last[1])
            self.last = (ahead, d)
            return
        self._close()
        if free:
            self.last = (ahead, d)
        else:
            self.items.append(d)

    def _join(self, d: StepDone) -> None:
        if self.run is None:
            self.run = [d.rank, metrics.step_start(d), d.t, 1, d.tx_bytes, d.rx_bytes]
        else:
            run = self.run
            run[2], run[3], run[4], run[5] = d.t, run[3] + 1, run[4] + d.tx_bytes, run[5] + d.rx_bytes

    def _close(self) -> None:
        if self.run is not None:
            rank, start, end, count, tx, rx = self.run
            self.items.append(StepRun(rank=rank, t=end, iter_s=end - start, count=count, tx_bytes=tx, rx_bytes=rx))
            self.run = None
        if self.last is not None:
            self.items.append(self.last[1])
            self.last = None

    def steps(self) -> list[StepDone | StepRun]:
        self._close()
        return self.items


class _Rank:
    __slots__ = ("counted", "sampled", "wire")

    def __init__(self, readings: list[float]) -> None:
        self.counted, self.sampled, self.wire = _Measured(), _Measured(), _Wire(readings)

    @property
    def measured(self) -> _Measured:
        """After the warm-up, sampled steps left out unless nothing else is (as metrics counts)."""
        return self.counted if self.counted.n else self.sampled


class _Segment:
    """One segment's steps as they arrive: its ranks' sums, its time span and the losses at its first and last
    step."""

    __slots__ = ("t1", "start", "own", "low", "high", "ranks")

    def __init__(self) -> None:
        self.t1, self.start, self.own = -math.inf, math.inf, False
        self.low: tuple[int, list[float]] | None = None
        self.high: tuple[int, list[float]] | None = None
        self.ranks: dict[int, _Rank] = {}

    def add(self, d: StepDone, measured_from: int, readings: dict[int, list[float]]) -> None:
        self.t1 = max(self.t1, d.t)
        self.start = min(self.start, metrics.step_start(d))
        self.own = self.own or d.own_s > 0
        if self.low is None or d.step < self.low[0]:
            self.low = (d.step, [d.loss])
        elif d.step == self.low[0]:
            self.low[1].append(d.loss)
        if self.high is None or d.step > self.high[0]:
            self.high = (d.step, [d.loss])
        elif d.step == self.high[0]:
            self.high[1].append(d.loss)
        rank = self.ranks.get(d.rank) or self.ranks.setdefault(d.rank, _Rank(readings.get(d.rank, [])))
        if d.step >= measured_from:
            (rank.sampled if d.sampled else rank.counted).add(d)
            rank.wire.add(d)

    def losses(self) -> list[tuple[int, float]]:
        ends = [self.low, self.high] if self.high[0] != self.low[0] else [self.low]
        return [(step, _mean(values)) for step, values in ends]


@dataclass(frozen=True)
class _Context:
    world: int
    param_bytes: int
    hosts: dict
    samples: list
    evals: list
    buckets: list | None
    front: tuple = ()  # the front's FrontCost readings (metrics.cost), the whole run's


def _stats(label: str, fig: metrics.SegmentFigures, seg: _Segment, ctx: _Context) -> SegmentStats:
    config = sync_config(fig.config)
    measured = {r: seg.ranks[r].measured for r in fig.ranks}
    t0 = min(m.start for m in measured.values() if m.n)
    t1 = seg.t1
    window = [s for s in ctx.samples if t0 <= s.t <= t1]
    # NIC counters see every step's bytes, sampled steps' too: bytes per step count every step after the warm-up
    wire_steps = {r: seg.ranks[r].wire.steps() for r in measured}
    overlapped = config.strategy == "ddp"  # the others sync after the backward pass (ddptop.metrics.traffic)
    ranks = tuple(rank_stats(r, fig.ranks[r], wire_steps[r], window, ctx.hosts, overlapped) for r in sorted(measured))
    nic_ok = ranks and all(r.nic_sent_mb is not None for r in ranks)
    mean = fig.mean
    ring_bytes = wire.ring_allreduce(wire.compressed(ctx.param_bytes, config.compress), ctx.world)[0]
    gbps = (ring_bytes / mean.comm_s / 1e9 if mean.comm_s > 0 and config.strategy in ("allreduce", "ddp")
            and ctx.world > 1 and not config.powersgd_rank else None)  # PowerSGD: its factors, not S
    slow = list(measured[fig.slowest_rank].times) if fig.slowest_rank in measured else []
    cpus = [s.proc_cpu_percent for s in window]
    return SegmentStats(
        label=label, index=fig.index, config=config, world_size=ctx.world, first_step=fig.first_step,
        measured_steps=fig.measured_steps, mean_step_s=fig.slowest.step_s, median_step_s=fig.slowest.median_step_s,
        images_per_s=fig.images_per_s, compute_s=mean.compute_s, micro_s=mean.micro_s, comm_s=mean.comm_s,
        exposed_comm_s=mean.exposed_comm_s, overlap=mean.overlap, sent_mb_per_step=mean.tx_bytes / 1e6,
        recv_mb_per_step=mean.rx_bytes / 1e6,
        nic_sent_mb_per_step=_mean([r.nic_sent_mb for r in ranks]) if nic_ok else None,
        nic_recv_mb_per_step=_mean([r.nic_recv_mb for r in ranks]) if nic_ok else None,
        cpu_percent=_mean(cpus) if cpus else None,
        rss_mb=_mean([s.proc_rss_bytes for s in window]) / 1e6 if window else None,
        final_loss=fig.final_loss, allreduce_gbps=gbps, losses=seg.losses(),
        mean_rank_step_s=mean.step_s, own_s=mean.own_s, threads_s=mean.threads_s,
        front_s=front_per_step(r for r in ctx.front if fig.first_step <= r.step <= fig.last_step)[0],
        other_s=mean.other_s, last_step=fig.last_step,
        warmup=fig.warmup, slowest_rank=fig.slowest_rank, step_p10=quantile(slow, 0.1), step_p90=quantile(slow, 0.9),
        parts=_parts(measured), ranks=ranks, t0=t0, t1=t1, seg_t0=seg.start,
        gpus=gpus(window, ctx.hosts),
        evals=tuple(e for e in ctx.evals if fig.first_step < e[0] <= fig.last_step + 1),
        links=links(wire_steps, window, ranks, overlapped),
        buckets_mb=tuple(_bucket_mb(ctx.buckets)), param_bytes=ctx.param_bytes, tokens_per_s=fig.tokens_per_s,
        own_recorded=seg.own)


def _parts(measured: dict[int, _Measured]) -> dict[str, float]:
    """metrics.parts of every measured step: the mean per rank, then the mean over ranks (as metrics does)."""
    per_rank = [{k: v / m.n for k, v in m.parts.items()} for m in measured.values() if m.n]
    return {k: _mean([p[k] for p in per_rank]) for k in PARTS}


def _split(d: StepDone) -> dict[str, float]:
    parts = metrics.parts(d)
    if d.fwd_s + d.bwd_s + d.opt_s == 0 and d.compute_s > 0:  # a file from before the split: compute whole
        parts["compute"] = d.compute_s
    return parts


def test_accuracy(events: list[Event]) -> list[tuple[int, float, float]]:
    """(step, accuracy, test loss) at each epoch end, over every rank's shard of the test set."""
    by_epoch: dict[int, list[EpochDone]] = {}
    for e in events:
        if isinstance(e, EpochDone):
            by_epoch.setdefault(e.epoch, []).append(e)
    out = []
    for epoch in sorted(by_epoch):
        es = by_epoch[epoch]
        total = sum(e.total for e in es)
        if total > 0:
            out.append((max(e.step for e in es), sum(e.correct for e in es) / total,
                        sum(e.test_loss * e.total for e in es) / total))
    return out


def _bucket_mb(buckets) -> list[float]:
    if not isinstance(buckets, list):
        return []
    return [b[1] / 1e6 for b in buckets if isinstance(b, list) and len(b) == 2 and isinstance(b[1], (int, float))]


@dataclass(frozen=True)
class Scaling:
    config: str
    world_size: int
    images_per_s: float
    speedup: float
    efficiency: float


def scaling(stats: list[SegmentStats]) -> list[Scaling]:
    """Speedup of each configuration over its smallest world size, by throughput (weak scaling: fixed batch per
    rank), and efficiency = speedup / (N / N_smallest)."""
    out = []
    for config in sorted({s.config.describe() for s in stats}):
        same = sorted((s for s in stats if s.config.describe() == config), key=lambda s: s.world_size)
        if len({s.world_size for s in same}) < 2:
            continue
        base = same[0]
        for s in same:
            speedup = s.images_per_s / base.images_per_s if base.images_per_s else 0.0
            efficiency = speedup / (s.world_size / base.world_size)
            out.append(Scaling(config, s.world_size, s.images_per_s, speedup, efficiency))
    return out
