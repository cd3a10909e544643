"""What a segment's ranks read besides their steps: CPU and memory per rank, bytes per network interface, GPUs.

Pure (no plotting, no torch); analysis.py calls these once per segment with the segment's system samples.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from ddptop import metrics
from ddptop.events import StepDone, SystemSample
from ddptop.metrics.traffic import measured_vs_expected

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
        if not values:
            return None
        return cls(statistics.fmean(values), quantile(values, 0.1), quantile(values, 0.9), len(values))


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
    comm_s: float = 0.0  # mean communication time per step (metrics.Figures.comm_s)


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



def rank_stats(rank: int, fig: metrics.Figures, steps: list[StepDone], window: list[SystemSample],
               hosts: dict, overlapped: bool = True) -> RankStats:
    mine = [s for s in window if s.rank == rank]
    traffic = measured_vs_expected(mine, steps, overlapped)
    nic = None
    if traffic is not None and traffic.iface not in LOOPBACK and traffic.steps:
        nic = (traffic.nic_tx / traffic.steps / 1e6, traffic.nic_rx / traffic.steps / 1e6)
    host = hosts.get(rank) or (mine[0].host if mine else "?")
    return RankStats(rank=rank, host=host, step_s=fig.step_s, sent_mb=fig.tx_bytes / 1e6, recv_mb=fig.rx_bytes / 1e6,
                     cpu=Spread.of([s.proc_cpu_percent for s in mine]),
                     rss_mb=Spread.of([s.proc_rss_bytes / 1e6 for s in mine]),
                     nic_sent_mb=nic[0] if nic else None, nic_recv_mb=nic[1] if nic else None, comm_s=fig.comm_s)


def links(wire_steps: dict[int, list[StepDone]], window: list[SystemSample],
          ranks: tuple[RankStats, ...], overlapped: bool = True) -> tuple[LinkStats, ...]:
    groups: dict[tuple, list[RankStats]] = {}
    for r in ranks:
        mine = [s for s in window if s.rank == r.rank]
        iface = mine[0].job_iface if mine else ""
        groups.setdefault((r.host, iface) if iface in LOOPBACK else (r.rank, iface), []).append(r)
    out = []
    for (who, iface), members in groups.items():
        first = members[0].rank
        traffic = measured_vs_expected([s for s in window if s.rank == first], wire_steps[first], overlapped)
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


def gpus(window: list[SystemSample], hosts: dict) -> tuple[GpuRow, ...]:
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
