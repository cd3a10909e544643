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
    if kind == "allgather":  # a ring all-gather of S (and NCCL's reduce-scatter): (N−1)/N·S each way
        return (world - 1) / world * nbytes
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
    alpha_fitted: bool = True  # False: the samples' sizes could not separate α from β, α is the caller's

    def time(self, kind: str, nbytes: float, world: int, beta: float | None = None) -> float:
        if world <= 1:
            return 0.0
        b = self.beta if beta is None else beta
        return self.alpha * latency_steps(kind, world) + b * wire_bytes(kind, nbytes, world)


def work_s(sample: CommSample, slowdown: float) -> float:
    """The time a collective would have taken alone: the part the backward pass ran beside went 1/(1+s) as fast."""
    return sample.dur_s - sample.overlap_s + sample.overlap_s / (1 + slowdown)


def fit_line(kind: str, samples: Sequence[CommSample], world: int, slowdown: float = 0.0,
             default_alpha: float = DEFAULT_ALPHA) -> Line | None:
    """Least squares over the samples' times alone (compute.py: what running beside the backward pass costs);
    `default_alpha` where their sizes cannot separate α from β (constants.alpha)."""
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
    else:  # one size (DDP's buckets pooled per step): α cannot be told from β, so it is the caller's
        alpha = default_alpha
        beta = max(0.0, sum(ys) - alpha * steps * len(ys)) / sum(xs) if sum(xs) > 0 else 0.0
    fitted = max(xs) >= 2 * max(min(xs), 1.0)
    line = Line(alpha, beta, 0.0, len(alone), fitted)
    errors = [(line.time(kind, s.nbytes, world) - y) / y for s, y in zip(alone, ys)]
    return Line(alpha, beta, (sum(e * e for e in errors) / len(errors)) ** 0.5, len(alone), fitted)


# a bucket counts as beside the backward pass when at least this share of its time ran beside it, as alone when at
# most 1 − this share did
BESIDE = 0.8
MAX_SLOWDOWN = 4.0  # a transfer beside compute at most 5× slower: beyond, the fit is noise (two tiny buckets)
MIN_EACH = 2  # buckets of each kind (beside, alone) the fit needs: one of each moved cs744-lab-buckets' rows 3 points


def fit_comm_slowdown(isolated: Sequence[CommSample], world: int, alpha: float = DEFAULT_ALPHA) -> float | None:
    """How much slower a transfer ran beside the backward pass than alone, from one segment's DDP buckets that no
    other bucket ran beside (so each span is its own transfer): time − α·steps = β·w·(1 − f) + β(1+s)·w·f over
    the buckets' wire bytes w and shares f beside the backward pass, by least squares. None unless MIN_EACH buckets
    ran beside it (f ≥ BESIDE) and MIN_EACH alone (f ≤ 1 − BESIDE): else the two cannot be told apart
    (compute.py's constant stands). gloo's transfers take the host's CPU: on the lab's unshaped links a bucket
    beside the backward pass ran 2.5× slower, at 1 Gbit/s about 1.2× (README "What-if / advise")."""
    pts = [(wire_bytes("allreduce", s.nbytes, world), s.dur_s - alpha * latency_steps("allreduce", world),
            min(1.0, s.overlap_s / s.dur_s)) for s in isolated if s.dur_s > 0 and s.nbytes > 0]
    if (world <= 1 or sum(f >= BESIDE for _, _, f in pts) < MIN_EACH
            or sum(f <= 1 - BESIDE for _, _, f in pts) < MIN_EACH):
        return None
    rows = [(w * (1 - f), w * f, t) for w, t, f in pts]
    a11 = sum(x * x for x, _, _ in rows)
    a12 = sum(x * y for x, y, _ in rows)
    a22 = sum(y * y for _, y, _ in rows)
    b1 = sum(x * t for x, _, t in rows)
    b2 = sum(y * t for _, y, t in rows)
    det = a11 * a22 - a12 * a12
    if det <= 0:
        return None
    alone, beside = (b1 * a22 - b2 * a12) / det, (a11 * b2 - a12 * b1) / det
    if alone <= 0 or beside <= 0:
        return None
    return min(MAX_SLOWDOWN, max(0.0, beside / alone - 1.0))


def fit_links(samples: Iterable[CommSample], world: int, slowdown: float = 0.0,
              default_alpha: float = DEFAULT_ALPHA) -> dict[str, Line]:
    """One line per kind seen; kinds not seen borrow the busiest-sampled kind's line (same link, same β)."""
    by_kind: dict[str, list[CommSample]] = {}
    for s in samples:
        by_kind.setdefault(s.kind, []).append(s)
    lines = {k: line for k, v in by_kind.items()
             if (line := fit_line(k, v, world, slowdown, default_alpha)) is not None}
    if not lines:
        return {}
    best = max(lines.values(), key=lambda line: line.samples)
    return {k: lines.get(k, best) for k in ("allreduce", "gather", "scatter", "broadcast", "allgather")}
