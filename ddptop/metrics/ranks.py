"""Provides a job's ranks reduced to a few numbers: median, p90 and worst of a per-rank figure, and the top k ranks.

Operators of large jobs look at a figure's spread over ranks and at its outliers, not at a row per rank (NVIDIA's
straggler detector prints the top k, traceml the median against the worst rank). Pure: no torch, no I/O.
"""

from __future__ import annotations

import statistics
from typing import Iterable, Mapping

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
