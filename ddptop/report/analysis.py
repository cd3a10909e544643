"""Per-segment statistics from a recording's events (pure: no plotting, no torch).

The step, time, byte and loss figures are ddptop.metrics' (the numbers `info`, `export --csv` and the screen
show); this module adds what only a report needs: the spread of step times, the parts of a step, per-rank CPU,
memory and NIC bytes, GPU readings, test accuracy and the ring all-reduce bus bandwidth.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from dataclasses import dataclass, field

from ddptop import metrics
from ddptop.config import SyncConfig
from ddptop.errors import RecordingError, UsageError
from ddptop.events import ConfigApplied, EpochDone, Event, RankJoined, RunStarted, StepDone, SystemSample
from ddptop.metrics import wire
from ddptop.report.readings import GpuRow, LinkStats, RankStats, gpus, links, quantile, rank_stats

# metrics.parts' keys, and "compute" for steps recorded before compute was split into forward, backward, optimizer
PARTS = ("data", "compute", "forward", "backward", "exposed comm", "optimizer", "ddptop", "other")


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
    losses: list[tuple[int, float]] = field(default_factory=list)  # (step, mean loss over ranks), all steps
    mean_rank_step_s: float = 0.0  # the mean over ranks of their mean step time (mean_step_s: the slowest rank's)
    own_s: float = 0.0  # ddptop's own time per step
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

    @property
    def name(self) -> str:
        return f"{self.label} {self.config.describe()}".strip()

    @property
    def length(self) -> int:
        """Steps the segment ran (warm-up included)."""
        return self.last_step - self.first_step + 1


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


def segment_stats(events: list[Event], label: str = "", warmup: int | None = None,
                  run_config: dict | None = None, buckets: dict | None = None) -> list[SegmentStats]:
    """Statistics of every segment with at least one step: the figures of ddptop.metrics plus what only a report
    adds. `warmup` steps at each segment's start are not measured (default: metrics.warmup_for the run)."""
    warmup = metrics.warmup_for(run_config) if warmup is None else warmup
    started = next((e for e in events if isinstance(e, RunStarted)), None)
    steps = [e for e in events if isinstance(e, StepDone)]
    world = started.world_size if started else len({d.rank for d in steps}) or 1
    param_bytes = started.param_bytes if started else 0
    hosts = {e.rank: e.host for e in events if isinstance(e, RankJoined)}
    samples = [e for e in events if isinstance(e, SystemSample)]
    evals = test_accuracy(events)
    table = metrics.SegmentTable.of((e for e in events if isinstance(e, (ConfigApplied, StepDone))), warmup)
    by_segment: dict[int, list[StepDone]] = {}
    for d in steps:
        by_segment.setdefault(d.segment, []).append(d)
    out = []
    for fig in table.segments():
        if not fig.slowest.steps:
            continue
        seg_steps = by_segment[fig.index]
        measured = {r: _measured(seg_steps, r, fig.first_step + warmup) for r in fig.ranks}
        context = _Context(world, param_bytes, hosts, samples, evals, (buckets or {}).get(str(fig.index)))
        out.append(_stats(label, fig, measured, seg_steps, context))
    return out


def pooled(same: list[SegmentStats], name: str) -> float:
    """A figure of segments that ran one configuration (a sweep repeated in rounds), as one: their means weighted
    by measured steps, so every measured step counts once."""
    weights = [s.measured_steps or 1 for s in same]
    return sum(getattr(s, name) * w for s, w in zip(same, weights)) / sum(weights)


def _measured(seg_steps: list[StepDone], rank: int, first: int) -> list[StepDone]:
    """The steps metrics counts for a rank: after the warm-up, sampled steps left out unless nothing else is."""
    mine = [d for d in seg_steps if d.rank == rank and d.step >= first]
    return [d for d in mine if not d.sampled] or mine


@dataclass(frozen=True)
class _Context:
    world: int
    param_bytes: int
    hosts: dict
    samples: list
    evals: list
    buckets: list | None


def _stats(label: str, fig: metrics.SegmentFigures, measured: dict[int, list[StepDone]], seg_steps: list[StepDone],
           ctx: _Context) -> SegmentStats:
    config = sync_config(fig.config)
    counted = [d for ds in measured.values() for d in ds]
    t0 = min(metrics.step_start(d) for d in counted)
    t1 = max(d.t for d in seg_steps)
    window = [s for s in ctx.samples if t0 <= s.t <= t1]
    # NIC counters see every step's bytes, sampled steps' too: bytes per step count every step after the warm-up
    wire_steps = {r: [d for d in seg_steps if d.rank == r and d.step >= fig.first_step + fig.warmup] for r in measured}
    overlapped = config.strategy == "ddp"  # the others sync after the backward pass (ddptop.metrics.traffic)
    ranks = tuple(rank_stats(r, fig.ranks[r], wire_steps[r], window, ctx.hosts, overlapped) for r in sorted(measured))
    nic_ok = ranks and all(r.nic_sent_mb is not None for r in ranks)
    mean = fig.mean
    ring_bytes = wire.ring_allreduce(ctx.param_bytes, ctx.world)[0]
    gbps = (ring_bytes / mean.comm_s / 1e9 if mean.comm_s > 0 and config.strategy in ("allreduce", "ddp")
            and ctx.world > 1 else None)
    by_step: dict[int, list[float]] = {}
    for d in seg_steps:
        by_step.setdefault(d.step, []).append(d.loss)
    slow = [d.iter_s for d in measured.get(fig.slowest_rank, [])]
    cpus = [s.proc_cpu_percent for s in window]
    return SegmentStats(
        label=label, index=fig.index, config=config, world_size=ctx.world, first_step=fig.first_step,
        measured_steps=fig.measured_steps, mean_step_s=fig.slowest.step_s, median_step_s=fig.slowest.median_step_s,
        images_per_s=fig.images_per_s, compute_s=mean.compute_s, comm_s=mean.comm_s,
        exposed_comm_s=mean.exposed_comm_s, overlap=mean.overlap, sent_mb_per_step=mean.tx_bytes / 1e6,
        recv_mb_per_step=mean.rx_bytes / 1e6,
        nic_sent_mb_per_step=_mean([r.nic_sent_mb for r in ranks]) if nic_ok else None,
        nic_recv_mb_per_step=_mean([r.nic_recv_mb for r in ranks]) if nic_ok else None,
        cpu_percent=_mean(cpus) if cpus else None,
        rss_mb=_mean([s.proc_rss_bytes for s in window]) / 1e6 if window else None,
        final_loss=fig.final_loss, allreduce_gbps=gbps, losses=sorted((s, _mean(v)) for s, v in by_step.items()),
        mean_rank_step_s=mean.step_s, own_s=mean.own_s, other_s=mean.other_s, last_step=fig.last_step,
        warmup=fig.warmup, slowest_rank=fig.slowest_rank, step_p10=quantile(slow, 0.1), step_p90=quantile(slow, 0.9),
        parts=_parts(measured), ranks=ranks, t0=t0, t1=t1, seg_t0=min(metrics.step_start(d) for d in seg_steps),
        gpus=gpus(window, ctx.hosts),
        evals=tuple(e for e in ctx.evals if fig.first_step < e[0] <= fig.last_step + 1),
        links=links(wire_steps, window, ranks, overlapped),
        buckets_mb=tuple(_bucket_mb(ctx.buckets)), param_bytes=ctx.param_bytes,
        own_recorded=any(d.own_s > 0 for d in seg_steps))


def _parts(measured: dict[int, list[StepDone]]) -> dict[str, float]:
    """metrics.parts of every measured step: the mean per rank, then the mean over ranks (as metrics does)."""
    per_rank = []
    for steps in measured.values():
        if steps:
            split = [_split(d) for d in steps]
            per_rank.append({k: _mean([p.get(k, 0.0) for p in split]) for k in PARTS})
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
