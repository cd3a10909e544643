"""Per-segment statistics from a recording's events (pure: no plotting, no torch)."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from ddptop import metrics
from ddptop.config import SyncConfig
from ddptop.events import ConfigApplied, Event, RunStarted, StepDone, SystemSample
from ddptop.probes import wire
from ddptop.traffic import measured_vs_expected


@dataclass(frozen=True)
class SegmentStats:
    """One configuration segment of one run, measured steps only (warm-up steps dropped)."""

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

    @property
    def name(self) -> str:
        return f"{self.label} {self.config.describe()}".strip()


def _mean(values: list[float]) -> float:
    return statistics.fmean(values) if values else 0.0


def segment_stats(events: list[Event], label: str = "", warmup: int | None = None,
                  run_config: dict | None = None) -> list[SegmentStats]:
    """Statistics of every segment: the figures of ddptop.metrics (the same numbers `info`, `export --csv` and the
    screen show), plus what only a report adds (NIC bytes, CPU, memory, bus bandwidth). `warmup` steps at each
    segment's start are not measured (default: metrics.warmup_for the run)."""
    warmup = metrics.warmup_for(run_config) if warmup is None else warmup
    started = next((e for e in events if isinstance(e, RunStarted)), None)
    steps = [e for e in events if isinstance(e, StepDone)]
    world = started.world_size if started else len({d.rank for d in steps}) or 1
    param_bytes = started.param_bytes if started else 0
    table = metrics.SegmentTable.of((e for e in events if isinstance(e, (ConfigApplied, StepDone))), warmup)
    out = []
    for fig in table.segments():
        if not fig.slowest.steps:
            continue
        seg_steps = [d for d in steps if d.segment == fig.index]
        measured = [d for d in seg_steps if d.step >= fig.first_step + warmup and not d.sampled] or seg_steps
        samples = [e for e in events if isinstance(e, SystemSample)
                   and min(d.t for d in seg_steps) - 1.0 <= e.t <= max(d.t for d in seg_steps)]
        out.append(_stats(label, fig, world, measured, seg_steps, samples, param_bytes))
    return out


def _stats(label, fig, world, measured, seg_steps, samples, param_bytes) -> SegmentStats:
    config = SyncConfig(**fig.config)
    ranks = sorted({d.rank for d in measured})
    nic = _nic_per_step(ranks, samples, measured)
    mean = fig.mean
    ring_bytes = wire.ring_allreduce(param_bytes, world)[0]
    gbps = (ring_bytes / mean.comm_s / 1e9 if mean.comm_s > 0 and config.strategy in ("allreduce", "ddp")
            and world > 1 else None)
    by_step: dict[int, list[float]] = {}
    for d in seg_steps:
        by_step.setdefault(d.step, []).append(d.loss)
    return SegmentStats(
        label=label, index=fig.index, config=config, world_size=world, first_step=fig.first_step,
        measured_steps=fig.measured_steps, mean_step_s=fig.slowest.step_s, median_step_s=fig.slowest.median_step_s,
        images_per_s=fig.images_per_s, compute_s=mean.compute_s, comm_s=mean.comm_s,
        exposed_comm_s=mean.exposed_comm_s, overlap=mean.overlap, sent_mb_per_step=mean.tx_bytes / 1e6,
        recv_mb_per_step=mean.rx_bytes / 1e6, nic_sent_mb_per_step=nic[0], nic_recv_mb_per_step=nic[1],
        cpu_percent=_mean([s.proc_cpu_percent for s in samples]) if samples else None,
        rss_mb=_mean([s.proc_rss_bytes for s in samples]) / 1e6 if samples else None,
        final_loss=fig.final_loss, allreduce_gbps=gbps, losses=sorted((step, _mean(v)) for step, v in by_step.items()),
        mean_rank_step_s=mean.step_s, own_s=mean.own_s, other_s=mean.other_s,
    )


def _nic_per_step(ranks, samples, measured) -> tuple[float | None, float | None]:
    sent, recv = [], []
    for rank in ranks:
        traffic = measured_vs_expected([s for s in samples if s.rank == rank], [d for d in measured if d.rank == rank])
        if traffic is None or traffic.iface in ("lo", "lo0") or traffic.steps == 0:
            return None, None
        sent.append(traffic.nic_tx / traffic.steps / 1e6)
        recv.append(traffic.nic_rx / traffic.steps / 1e6)
    return (_mean(sent), _mean(recv)) if sent else (None, None)


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
