"""Provides a job's ranks reduced to a few numbers: median, p90 and worst of a per-rank figure, and the top k ranks.

Operators of large jobs look at a figure's spread over ranks and at its outliers, not at a row per rank (NVIDIA's
straggler detector prints the top k, traceml the median against the worst rank). Pure: no torch, no I/O.
"""

from __future__ import annotations

import statistics
from typing import Callable, Iterable, Mapping

from ddptop.events import StepDone
from ddptop.metrics import busy_s

STATS = ("median", "p90", "worst")  # the spread of a figure over ranks, in this order everywhere


def spread(values: Iterable[float]) -> dict[str, float]:
    """{median, p90, worst} of one figure over ranks (one value per rank); worst is the largest (every figure
    spread so is a time: the slowest rank is the worst). p90 interpolates linearly between the two closest ranks
    (numpy's default percentile, `statistics.quantiles(method='inclusive')`); with one rank all three are its value.
    Empty: {}."""
    values = sorted(values)
    if not values:
        return {}
    p90 = statistics.quantiles(values, n=10, method="inclusive")[-1] if len(values) > 1 else values[0]
    return {"median": statistics.median(values), "p90": p90, "worst": values[-1]}


def top(by_rank: Mapping[int, float], k: int) -> list[int]:
    """The k ranks with the largest values (the slowest first when the values are step times); ties go to the
    lower rank, so the choice is the same at every call with the same values."""
    return sorted(by_rank, key=lambda r: (-by_rank[r], r))[:max(0, k)]


# The figures a large job is reduced to, by the glossary's words: name → (the Figures field over a rank's window, the
# same figure of one step). "wait" in issue 45's list is the exposed communication (the glossary: what the step
# waited for); busy is the step less that wait (metrics.busy_s), the figure that singles out a slow rank under DDP.
FIGURES: dict[str, tuple[str, Callable[[StepDone], float]]] = {
    "step": ("step_s", lambda d: d.iter_s),
    "busy": ("busy_s", busy_s),
    "compute": ("compute_s", lambda d: d.compute_s),
    "exposed comm": ("exposed_comm_s", lambda d: d.exposed_comm_s),
    "data": ("data_s", lambda d: d.data_s),
}
SCORED_BY = "busy"  # the figure a rank's score compares; why busy and not step: score()
SCALE_RANKS = 16  # from this many ranks the screen summarizes (Ranks and Network panels) instead of a row per rank
HEAT_LEVELS = (1.25, 1.5, 2.0)  # a heatmap cell's level: its value over the median cell, at or above each bound


def score(by_rank: Mapping[int, float]) -> dict[int, float]:
    """Each rank's score: the median over ranks of its figure divided by its own (1.00 a typical rank, 0.50 one
    twice as slow, above 1 a faster one). NVIDIA's straggler detector scores best/this, 0-1; the median here, since
    at 256 ranks the best is an outlier too. Given busy time (SCORED_BY), not step time: under DDP a slow rank makes
    every rank's step slower (metrics.changes), so step time scores every rank alike. A rank at 0: score 1."""
    if not by_rank:
        return {}
    middle = statistics.median(by_rank.values())
    return {r: (middle / v if v > 0 else 1.0) for r, v in by_rank.items()}


def worst(by_rank: Mapping[int, float]) -> int | None:
    """The rank with the largest value (the lower rank on a tie): who `spread`'s worst is."""
    return top(by_rank, 1)[0] if by_rank else None


def heat_level(value: float, middle: float) -> int:
    """0-3: how far `value` is above `middle` (the median cell) by HEAT_LEVELS; 0 when middle is 0."""
    if middle <= 0:
        return 0
    return sum(value >= bound * middle for bound in HEAT_LEVELS)
