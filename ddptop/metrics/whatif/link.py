"""Provides the α–β link fit: a collective's time = α + β·(bytes its busiest link carries), one fit per kind.

Bytes are normalized to what the busiest rank's link moves (metrics.wire): a ring all-reduce of S moves 2(N−1)/N·S
each way, a gather to the root (N−1)·S into it, a scatter (N−1)·S out of it. β is then seconds per byte of that
link, shared by every kind, so a fit from DDP's buckets alone also predicts gather+scatter, another world size and
another link rate; a kind with its own samples (sizes that differ by ≥2×) gets its own α and β.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Iterable, Sequence

from ddptop.metrics.whatif.data import CommSample

# seconds per latency step of a collective when the samples cannot separate it: gloo's own cost per collective
# (0.9 ms a ring step, 3.6 ms per all_reduce on 3 lab hosts of 0.67 core: 102 per-parameter all_reduces fitted
# at 984 Mbit/s on a 1 Gbit/s link, README "What-if / advise")
DEFAULT_ALPHA = 0.9e-3


def wire_bytes(kind: str, nbytes: float, world: int) -> float:
    """Bytes the busiest link carries one way for a collective of `nbytes` on `world` ranks."""
    if world <= 1:
        return 0.0
    if kind == "allreduce":
        return 2 * (world - 1) / world * nbytes
    return (world - 1) * nbytes  # gather, scatter, broadcast (gloo's broadcast and scatter send from the root)


def latency_steps(kind: str, world: int) -> float:
    """How many message latencies a collective waits for: a ring's 2(N−1) steps, a root's N−1 peers."""
    return 2 * (world - 1) if kind == "allreduce" else (world - 1)


@dataclass(frozen=True)
class Line:
    """time = alpha·latency_steps + beta·wire_bytes, fitted on `world` ranks; residual: relative RMS of the fit."""

    alpha: float  # seconds per latency step
    beta: float  # seconds per wire byte
    residual: float
    samples: int

    def time(self, kind: str, nbytes: float, world: int, beta: float | None = None) -> float:
        if world <= 1:
            return 0.0
        b = self.beta if beta is None else beta
        return self.alpha * latency_steps(kind, world) + b * wire_bytes(kind, nbytes, world)


def work_s(sample: CommSample, slowdown: float) -> float:
    """The time a collective would have taken alone: the part the backward pass ran beside went 1/(1+s) as fast."""
    return sample.dur_s - sample.overlap_s + sample.overlap_s / (1 + slowdown)


def fit_line(kind: str, samples: Sequence[CommSample], world: int, slowdown: float = 0.0) -> Line | None:
    """Least squares over the samples' times alone (compute.py: what running beside the backward pass costs)."""
    alone = [s for s in samples if s.dur_s > 0]
    if not alone or world <= 1:
        return None
    xs = [wire_bytes(kind, s.nbytes, world) for s in alone]
    ys = [work_s(s, slowdown) for s in alone]
    steps = latency_steps(kind, world)
    if max(xs) >= 2 * max(min(xs), 1.0):  # sizes spread enough to tell latency from bandwidth
        mx, my = statistics.fmean(xs), statistics.fmean(ys)
        var = sum((x - mx) ** 2 for x in xs)
        beta = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / var if var > 0 else 0.0
        alpha = (my - beta * mx) / steps
        if beta <= 0 or alpha < 0:  # noise on few sizes: fall back to bandwidth only
            alpha, beta = 0.0, sum(ys) / sum(xs)
    else:  # one size (DDP's buckets pooled per step): α cannot be told from β, so it is the lab's
        alpha = DEFAULT_ALPHA
        beta = max(0.0, sum(ys) - alpha * steps * len(ys)) / sum(xs) if sum(xs) > 0 else 0.0
    line = Line(alpha, beta, 0.0, len(alone))
    errors = [(line.time(kind, s.nbytes, world) - y) / y for s, y in zip(alone, ys)]
    return Line(alpha, beta, (sum(e * e for e in errors) / len(errors)) ** 0.5, len(alone))


def fit_links(samples: Iterable[CommSample], world: int, slowdown: float = 0.0) -> dict[str, Line]:
    """One line per kind seen; kinds not seen borrow the busiest-sampled kind's line (same link, same β)."""
    by_kind: dict[str, list[CommSample]] = {}
    for s in samples:
        by_kind.setdefault(s.kind, []).append(s)
    lines = {k: line for k, v in by_kind.items() if (line := fit_line(k, v, world, slowdown)) is not None}
    if not lines:
        return {}
    best = max(lines.values(), key=lambda line: line.samples)
    return {k: lines.get(k, best) for k in ("allreduce", "gather", "scatter", "broadcast")}
