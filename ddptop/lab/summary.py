"""A lab run's figures against the lab's own link: ring bus bandwidth as % of the link, NIC bytes per host.

`ddptop report` knows the job; only the lab knows the link it ran on, so `ddptop lab --record-dir DIR` adds
`DIR/report/lab.md` with these tables (HPML Lab 4 Q3.2's bandwidth utilization; CS744's node-0 traffic).
Numbers come from the recording: StepDone (step, compute and communication times) and SystemSample (each
host's own eth0 counters), over each segment's steps after its warm-up.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import dataclass

from ddptop.events import ConfigApplied, RunStarted, StepDone, SystemSample
from ddptop.lab.links import Link

QUIET_BYTES_S = 1e6  # a NIC moving less than this (telemetry, heartbeats) is between collectives


@dataclass(frozen=True)
class Segment:
    """One configuration's measured steps in one run: a segment, or every segment that ran it (interleaved rounds)."""

    run: str
    nodes: int
    segments: tuple[int, ...]
    config: str
    step_times: tuple[float, ...]  # per step: the slowest rank's step time
    computes: tuple[float, ...]  # per step: the mean over ranks
    comms: tuple[float, ...]
    ring_mb: float  # what a ring all-reduce moves per rank and step each way: 2(N−1)/N·S
    nic: tuple[tuple[float, float] | None, ...]  # per rank: (sent, received) MB per step on its eth0

    @property
    def step_s(self) -> float:
        return statistics.median(self.step_times)

    @property
    def compute_s(self) -> float:
        return statistics.median(self.computes)

    @property
    def comm_s(self) -> float:
        return statistics.median(self.comms)

    def bus_gbit(self) -> float | None:
        """Ring bus bandwidth in Gbit/s: 2(N−1)/N·S / communication time (HPML Lab 4 Q3.2)."""
        return self.ring_mb * 8e-3 / self.comm_s if self.comm_s > 0 and self.ring_mb > 0 else None


def segments(events: list, run: str, warmup: int) -> list[Segment]:
    """Every segment's measured steps (its first `warmup` steps left out), in order."""
    started = next((e for e in events if isinstance(e, RunStarted)), None)
    if started is None:
        return []
    n, size = started.world_size, started.param_bytes
    configs = {e.segment: e.config for e in events if isinstance(e, ConfigApplied) and e.rank == 0}
    done: dict[int, dict[int, list[StepDone]]] = defaultdict(lambda: defaultdict(list))
    samples = defaultdict(list)
    for e in events:
        if isinstance(e, StepDone):
            done[e.segment][e.step].append(e)
        elif isinstance(e, SystemSample):
            samples[e.rank].append(e)
    out = []
    for seg, by_step in sorted(done.items()):
        rows = [by_step[s] for s in sorted(by_step)[warmup:] if len(by_step[s]) == n]
        if not rows:
            continue
        config = configs.get(seg, {})
        ring = 0.0 if config.get("strategy") in ("single", "gather-scatter") or n < 2 else 2 * (n - 1) / n * size
        nic = tuple(nic_per_step(samples[r], [d for row in rows for d in row if d.rank == r]) for r in range(n))
        out.append(Segment(run, n, (seg,), _describe(config), tuple(max(d.iter_s for d in row) for row in rows),
                           tuple(statistics.fmean(d.compute_s for d in row) for row in rows),
                           tuple(statistics.fmean(d.comm_s for d in row) for row in rows), ring / 1e6, nic))
    return out


def by_config(rows: list[Segment]) -> list[Segment]:
    """Segments that ran the same configuration in the same run, pooled: a profile that repeats its sweep in
    rounds compares configurations under the same background load, however the machine's load drifts."""
    groups: dict[tuple[str, str], list[Segment]] = {}
    for row in rows:
        groups.setdefault((row.run, row.config), []).append(row)
    out = []
    for same in groups.values():
        first = same[0]
        nic = tuple(_mean([row.nic[r] for row in same]) for r in range(first.nodes))
        out.append(Segment(first.run, first.nodes, tuple(s for row in same for s in row.segments), first.config,
                           tuple(t for row in same for t in row.step_times),
                           tuple(t for row in same for t in row.computes),
                           tuple(t for row in same for t in row.comms), first.ring_mb, nic))
    return out


def _mean(values: list[tuple[float, float] | None]) -> tuple[float, float] | None:
    known = [v for v in values if v is not None]
    return (statistics.fmean(v[0] for v in known), statistics.fmean(v[1] for v in known)) if known else None


def nic_per_step(samples: list[SystemSample], steps: list[StepDone],
                 quiet: float = QUIET_BYTES_S) -> tuple[float, float] | None:
    """(sent, received) MB per step on one rank's NIC, between two *quiet* samples of its counters.

    A rank's collective traffic flows while that rank is inside its collectives, within its step. A sample
    taken after a quiet interval (both rates below `quiet`) therefore falls between two steps' traffic, so the
    counters between two such samples hold exactly the steps that ended between them: no partial step at either
    end (with steps of seconds and samples every 0.5 s, a plain window would be off by up to a step's bytes).
    """
    steps = sorted(steps, key=lambda d: d.t)
    if not steps:
        return None
    calm = [s for s in sorted(samples, key=lambda s: s.t) if steps[0].t <= s.t <= steps[-1].t
            and (nic := s.nic()) is not None and nic.tx_rate < quiet and nic.rx_rate < quiet]
    if len(calm) < 2:
        return None
    a, b = calm[0], calm[-1]
    counted = sum(1 for d in steps if a.t < d.t <= b.t)
    if counted == 0:
        return None
    na, nb = a.nic(), b.nic()
    return (nb.tx_bytes - na.tx_bytes) / counted / 1e6, (nb.rx_bytes - na.rx_bytes) / counted / 1e6


def _describe(config: dict) -> str:
    strategy = config.get("strategy", "?")
    extra = f" {config.get('bucket_mb', 0):g} MB" if strategy == "ddp" else ""
    extra += " async" if config.get("async_op") else ""
    return f"{strategy}{extra}, batch {config.get('batch_size', '?')}"


def _ids(row: Segment) -> str:
    return ", ".join(str(s) for s in row.segments)


def markdown(rows: list[Segment], link: Link, lab: str) -> str:
    """The lab's tables: step times and link utilization per segment, then every host's NIC bytes per step."""
    lines = ["# The lab", "", lab, "",
             "| run | nodes | segments | config | steps | median s/step | compute s | comm s | ring bus Gbit/s | "
             "% of link |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        bus = r.bus_gbit()
        pct = f"{bus * 1e9 / link.bits_per_s:.0%}" if bus and link.bits_per_s else "–"
        lines.append(f"| {r.run or '-'} | {r.nodes} | {_ids(r)} | {r.config} | {len(r.step_times)} | {r.step_s:.3f} | "
                     f"{r.compute_s:.3f} | {r.comm_s:.3f} | {f'{bus:.3f}' if bus else '–'} | {pct} |")
    width = max((r.nodes for r in rows), default=0)
    lines += ["", "Ring bus bandwidth: 2(N−1)/N·S divided by the measured communication time per step; % of link: "
              f"against the lab's {link.describe()} each way.", "",
              "| run | segments | config | " + " | ".join(f"node {i} sent / received MB/step" for i in range(width))
              + " |", "|---|---|---|" + "---|" * width]
    for r in rows:
        cells = [f"{nic[0]:.1f} / {nic[1]:.1f}" if nic else "–" for nic in r.nic] + [""] * (width - r.nodes)
        lines.append(f"| {r.run or '-'} | {_ids(r)} | {r.config} | " + " | ".join(cells) + " |")
    lines += ["", "NIC bytes: each host's own eth0 counters (kernel-counted) over the segment's measured steps."]
    return "\n".join(lines) + "\n"
