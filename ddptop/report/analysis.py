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
from ddptop.probes import wire
from ddptop.traffic import measured_vs_expected

PARTS = ("data", "forward", "backward", "exposed comm", "optimizer", "ddptop", "other")  # metrics.parts' keys
LOOPBACK = ("lo", "lo0")


def quantile(values: list[float], q: float) -> float:
    """Linear interpolation between the closest ranks (numpy's default): q=0.1 is p10."""
    ordered = sorted(values)
    if not ordered:
        return math.nan
    pos = q * (len(ordered) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


@dataclass(frozen=True)
class Spread:
    """Mean and p10-p90 of a set of readings."""

    mean: float
    p10: float
    p90: float
    n: int

    @classmethod
    def of(cls, values: list[float]) -> "Spread | None":
        values = [v for v in values if math.isfinite(v)]
        return cls(statistics.fmean(values), quantile(values, 0.1), quantile(values, 0.9), len(values)) if values else None


@dataclass(frozen=True)
class RankStats:
    """One rank over a segment's measured steps."""

    rank: int
    host: str
    step_s: float
    sent_mb: float  # per step, by the formulas
    recv_mb: float
    cpu: Spread | None  # the rank's process, % of one core (top's convention), over the system samples
    rss_mb: Spread | None
    nic_sent_mb: float | None  # per step on the rank's job interface; None on a shared loopback
    nic_recv_mb: float | None


@dataclass(frozen=True)
class LinkStats:
    """One network interface over a segment: bytes counted per step against the formulas of the ranks behind it.

    Ranks on one machine share its loopback: one LinkStats for all of them, whose counters see every rank's
    traffic once each way (so its formula is the sum of theirs)."""

    name: str
    ranks: tuple[int, ...]
    iface: str
    host: str
    sent_mb: float  # per step, counted by the interface
    recv_mb: float
    formula_sent_mb: float  # per step, what the ranks behind it send by the algorithm
    formula_recv_mb: float


@dataclass(frozen=True)
class GpuRow:
    """One GPU of one rank over a segment, as nvidia-smi shows it (seed 004's table)."""

    rank: int
    host: str
    index: int
    name: str
    mem_used_mib: float | None  # the most used during the segment
    mem_total_mib: float | None
    util: Spread | None  # "volatile GPU-util", %


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
    links: tuple["LinkStats", ...] = ()  # what each network interface counted per step
    param_bytes: int = 0

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
    try:
        return SyncConfig(**{k: v for k, v in config.items() if k in known})
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
    t0 = min(d.t - d.iter_s for d in counted)
    t1 = max(d.t for d in seg_steps)
    window = [s for s in ctx.samples if t0 <= s.t <= t1]
    # NIC counters see every step's bytes, sampled steps' too: bytes per step count every step after the warm-up
    wire_steps = {r: [d for d in seg_steps if d.rank == r and d.step >= fig.first_step + fig.warmup] for r in measured}
    ranks = tuple(_rank(r, fig.ranks[r], wire_steps[r], window, ctx) for r in sorted(measured))
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
        parts=_parts(measured), ranks=ranks, t0=t0, t1=t1, seg_t0=min(d.t - d.iter_s for d in seg_steps),
        gpus=_gpus(window, ctx.hosts),
        evals=tuple(e for e in ctx.evals if fig.first_step < e[0] <= fig.last_step + 1),
        links=_links(wire_steps, window, ranks),
        buckets_mb=tuple(_bucket_mb(ctx.buckets)), param_bytes=ctx.param_bytes)


def _rank(rank: int, fig: metrics.Figures, steps: list[StepDone], window: list[SystemSample],
          ctx: _Context) -> RankStats:
    mine = [s for s in window if s.rank == rank]
    traffic = measured_vs_expected(mine, steps)
    nic = None
    if traffic is not None and traffic.iface not in LOOPBACK and traffic.steps:
        nic = (traffic.nic_tx / traffic.steps / 1e6, traffic.nic_rx / traffic.steps / 1e6)
    host = ctx.hosts.get(rank) or (mine[0].host if mine else "?")
    return RankStats(rank=rank, host=host, step_s=fig.step_s, sent_mb=fig.tx_bytes / 1e6, recv_mb=fig.rx_bytes / 1e6,
                     cpu=Spread.of([s.proc_cpu_percent for s in mine]),
                     rss_mb=Spread.of([s.proc_rss_bytes / 1e6 for s in mine]),
                     nic_sent_mb=nic[0] if nic else None, nic_recv_mb=nic[1] if nic else None)


def _links(wire_steps: dict[int, list[StepDone]], window: list[SystemSample],
           ranks: tuple[RankStats, ...]) -> tuple[LinkStats, ...]:
    groups: dict[tuple, list[RankStats]] = {}
    for r in ranks:
        mine = [s for s in window if s.rank == r.rank]
        iface = mine[0].job_iface if mine else ""
        groups.setdefault((r.host, iface) if iface in LOOPBACK else (r.rank, iface), []).append(r)
    out = []
    for (who, iface), members in groups.items():
        first = members[0].rank
        traffic = measured_vs_expected([s for s in window if s.rank == first], wire_steps[first])
        if traffic is None or not traffic.steps or not iface:
            continue
        shared = iface in LOOPBACK
        name = (f"{iface} on {who} (ranks {', '.join(str(m.rank) for m in members)}, shared)" if shared
                else f"rank {who} {iface}")
        out.append(LinkStats(name=name, ranks=tuple(m.rank for m in members), iface=iface, host=members[0].host,
                             sent_mb=traffic.nic_tx / traffic.steps / 1e6, recv_mb=traffic.nic_rx / traffic.steps / 1e6,
                             formula_sent_mb=sum(m.sent_mb for m in members),
                             formula_recv_mb=sum(m.recv_mb for m in members)))
    return tuple(out)


def _parts(measured: dict[int, list[StepDone]]) -> dict[str, float]:
    """metrics.parts of every measured step: the mean per rank, then the mean over ranks (as metrics does)."""
    per_rank = []
    for steps in measured.values():
        if steps:
            split = [metrics.parts(d) for d in steps]
            per_rank.append({k: _mean([p[k] for p in split]) for k in PARTS})
    return {k: _mean([p[k] for p in per_rank]) for k in PARTS}


def _gpus(window: list[SystemSample], hosts: dict) -> tuple[GpuRow, ...]:
    readings: dict[tuple[int, int], list] = {}
    for s in window:
        for g in s.gpus:
            readings.setdefault((s.rank, g.index), []).append(g)
    rows = []
    for (rank, index), gs in sorted(readings.items()):
        used = [g.mem_used_bytes for g in gs if g.mem_used_bytes is not None]
        total = [g.mem_total_bytes for g in gs if g.mem_total_bytes is not None]
        rows.append(GpuRow(rank=rank, host=hosts.get(rank, "?"), index=index, name=gs[-1].name,
                           mem_used_mib=max(used) / 2**20 if used else None,
                           mem_total_mib=max(total) / 2**20 if total else None,
                           util=Spread.of([g.util_percent for g in gs if g.util_percent is not None])))
    return tuple(rows)


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
            out.append(Scaling(config, s.world_size, s.images_per_s, speedup, speedup / (s.world_size / base.world_size)))
    return out
