"""A lab run's figures against the lab's own link: ring bus bandwidth as % of the link, NIC bytes per host.

`ddptop report` knows the job; only the lab knows the link it ran on, so `ddptop lab --record-dir DIR` adds
`DIR/report/lab.md`: the report's own per-segment figures (ddptop.report.analysis, i.e. ddptop.metrics) set
against the link (HPML Lab 4 Q3.2's bandwidth utilization), and each host's NIC bytes per step from its own
eth0 counters (CS744's node-0 traffic). A configuration that ran in several segments (a sweep repeated in
rounds) is pooled over all its measured steps.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from ddptop.events import RunStarted
from ddptop.lab.links import Link
from ddptop.metrics import wire
from ddptop.report.analysis import pooled, segment_stats


@dataclass(frozen=True)
class Segment:
    """One configuration in one run: a segment, or every segment that ran it, pooled."""

    run: str
    nodes: int
    segments: tuple[int, ...]
    config: str
    measured_steps: int  # the slowest rank's
    step_s: float  # the slowest rank's mean step time (ddptop.metrics)
    compute_s: float  # means over ranks
    comm_s: float
    ring_bytes: int  # what a ring all-reduce moves per rank and step each way, 2(N−1)/N·S; 0 when none runs
    nic: tuple[tuple[float, float] | None, ...]  # per rank: (sent, received) MB per step on its eth0

    def bus_gbit(self) -> float | None:
        """The report's all-reduce bus bandwidth, 2(N−1)/N·S / communication time, in Gbit/s."""
        return self.ring_bytes * 8 / self.comm_s / 1e9 if self.comm_s > 0 and self.ring_bytes else None


def segments(events: list, run: str, warmup: int) -> list[Segment]:
    """Every segment's measured figures, in order: the report's own (ddptop.report.analysis), NIC bytes included."""
    started = next((e for e in events if isinstance(e, RunStarted)), None)
    size = started.param_bytes if started else 0
    out = []
    for s in segment_stats(events, warmup=warmup):
        by_rank = {r.rank: r for r in s.ranks}
        nic = tuple((r.nic_sent_mb, r.nic_recv_mb) if r is not None and r.nic_sent_mb is not None else None
                    for r in (by_rank.get(i) for i in range(s.world_size)))
        ring = wire.ring_allreduce(size, s.world_size)[0] if s.allreduce_gbps is not None else 0
        out.append(Segment(run, s.world_size, (s.index,), s.config.describe(), s.measured_steps, s.mean_step_s,
                           s.compute_s, s.comm_s, ring, nic))
    return out


def by_config(rows: list[Segment]) -> list[Segment]:
    """Segments of one run that ran the same configuration, pooled (means weighted by measured steps): a profile
    that repeats its sweep in rounds compares configurations under the same drift of background load."""
    groups: dict[tuple[str, str], list[Segment]] = {}
    for row in rows:
        groups.setdefault((row.run, row.config), []).append(row)
    out = []
    for same in groups.values():
        first = same[0]
        nic = tuple(_mean([r.nic[i] for r in same]) for i in range(first.nodes))
        out.append(Segment(first.run, first.nodes, tuple(i for r in same for i in r.segments), first.config,
                           sum(r.measured_steps for r in same), pooled(same, "step_s"), pooled(same, "compute_s"),
                           pooled(same, "comm_s"), first.ring_bytes, nic))
    return out


def _mean(values: list[tuple[float, float] | None]) -> tuple[float, float] | None:
    known = [v for v in values if v is not None]
    return (statistics.fmean(v[0] for v in known), statistics.fmean(v[1] for v in known)) if known else None


def _ids(row: Segment) -> str:
    return ", ".join(str(s) for s in row.segments)


def markdown(rows: list[Segment], link: Link, lab: str) -> str:
    """The lab's tables: step times and link utilization per configuration, then every host's NIC bytes."""
    lines = ["# The lab", "", lab, "",
             "| run | nodes | segments | config | steps | mean s/step (slowest rank) | compute s | comm s | "
             "ring bus Gbit/s | % of link |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        bus = r.bus_gbit()
        pct = f"{bus * 1e9 / link.bits_per_s:.0%}" if bus and link.bits_per_s else "–"
        lines.append(f"| {r.run or '-'} | {r.nodes} | {_ids(r)} | {r.config} | {r.measured_steps} | {r.step_s:.3f} | "
                     f"{r.compute_s:.3f} | {r.comm_s:.3f} | {f'{bus:.3f}' if bus else '–'} | {pct} |")
    width = max((r.nodes for r in rows), default=0)
    lines += ["", "Step time, compute and communication as in `report.md` (ddptop.metrics), pooled over a "
              "configuration's segments; ring bus bandwidth: 2(N−1)/N·S divided by the communication time per "
              f"step; % of link: against the lab's {link.describe()} each way.", "",
              "| run | segments | config | " + " | ".join(f"node {i} sent / received MB/step" for i in range(width))
              + " |", "|---|---|---|" + "---|" * width]
    for r in rows:
        cells = [f"{nic[0]:.1f} / {nic[1]:.1f}" if nic else "–" for nic in r.nic] + [""] * (width - r.nodes)
        lines.append(f"| {r.run or '-'} | {_ids(r)} | {r.config} | " + " | ".join(cells) + " |")
    lines += ["", "NIC bytes: each host's own eth0 counters (kernel-counted) over the segment's measured steps, "
              "between two samples taken between two steps' traffic (in a forward pass), as in `report.md` "
              "(ddptop.metrics.traffic)."]
    return "\n".join(lines) + "\n"
