"""Per-segment statistics from a recording's events (pure: no plotting, no torch)."""

from __future__ import annotations

import dataclasses
import json
import statistics
from dataclasses import dataclass, field

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
    mean_step_s: float
    median_step_s: float
    images_per_s: float  # the whole job's, summed over ranks
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

    @property
    def name(self) -> str:
        return f"{self.label} {self.config.describe()}".strip()


def _mean(values: list[float]) -> float:
    return statistics.fmean(values) if values else 0.0


def segment_stats(events: list[Event], label: str = "", warmup: int | None = None,
                  run_config: dict | None = None) -> list[SegmentStats]:
    """Statistics of every segment. `warmup` steps at each segment's start are not measured (default: the
    sweep's warm-up when the run was a sweep, else 1: the first step of a segment builds buckets and caches)."""
    run_config = run_config or {}
    if warmup is None:
        warmup = int(run_config.get("sweep_warmup", 5)) if run_config.get("sweep") else 1
    started = next((e for e in events if isinstance(e, RunStarted)), None)
    steps = [e for e in events if isinstance(e, StepDone)]
    world = started.world_size if started else len({d.rank for d in steps}) or 1
    param_bytes = started.param_bytes if started else 0
    switches = sorted({(e.segment, e.step, json.dumps(e.config, sort_keys=True))
                       for e in events if isinstance(e, ConfigApplied) and e.rank == 0})
    out = []
    for segment, first_step, text in switches:
        seg_steps = [d for d in steps if d.segment == segment]
        if not seg_steps:
            continue
        config = _sync_config(json.loads(text))
        measured = [d for d in seg_steps if d.step >= first_step + warmup] or seg_steps
        samples = [e for e in events if isinstance(e, SystemSample)
                   and min(d.t for d in seg_steps) - 1.0 <= e.t <= max(d.t for d in seg_steps)]
        out.append(_stats(label, segment, config, world, first_step, measured, seg_steps, samples, param_bytes))
    return out


def _sync_config(config: dict) -> SyncConfig:
    """A segment's configuration as recorded; fields this ddptop does not know are left out (a file from anyone)."""
    known = {f.name for f in dataclasses.fields(SyncConfig)}
    return SyncConfig(**{k: v for k, v in config.items() if k in known})


def _per_step_max(measured: list[StepDone]) -> list[float]:
    """The job's step time is its slowest rank's."""
    by_step: dict[int, float] = {}
    for d in measured:
        by_step[d.step] = max(by_step.get(d.step, 0.0), d.iter_s)
    return list(by_step.values())


def _stats(label, segment, config, world, first_step, measured, seg_steps, samples, param_bytes) -> SegmentStats:
    step_times = _per_step_max(measured)
    ranks = sorted({d.rank for d in measured})
    nic = _nic_per_step(ranks, samples, measured)
    own = samples  # every rank's process, over the segment's time
    comm_s = _mean([d.comm_s for d in measured])
    ring_bytes = wire.ring_allreduce(param_bytes, world)[0]
    gbps = ring_bytes / comm_s / 1e9 if comm_s > 0 and config.strategy in ("allreduce", "ddp") and world > 1 else None
    last_step = max(d.step for d in seg_steps)
    by_step: dict[int, list[float]] = {}
    for d in seg_steps:
        by_step.setdefault(d.step, []).append(d.loss)
    return SegmentStats(
        label=label, index=segment, config=config, world_size=world, first_step=first_step,
        measured_steps=len(step_times), mean_step_s=_mean(step_times), median_step_s=statistics.median(step_times),
        images_per_s=sum(_mean([d.images_per_s for d in measured if d.rank == r]) for r in ranks),
        compute_s=_mean([d.compute_s for d in measured]), comm_s=comm_s,
        exposed_comm_s=_mean([d.exposed_comm_s for d in measured]), overlap=_mean([d.overlap for d in measured]),
        sent_mb_per_step=_mean([d.tx_bytes for d in measured]) / 1e6,
        recv_mb_per_step=_mean([d.rx_bytes for d in measured]) / 1e6,
        nic_sent_mb_per_step=nic[0], nic_recv_mb_per_step=nic[1],
        cpu_percent=_mean([s.proc_cpu_percent for s in own]) if own else None,
        rss_mb=_mean([s.proc_rss_bytes for s in own]) / 1e6 if own else None,
        final_loss=_mean([d.loss for d in seg_steps if d.step == last_step]),
        allreduce_gbps=gbps, losses=sorted((step, _mean(v)) for step, v in by_step.items()),
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
