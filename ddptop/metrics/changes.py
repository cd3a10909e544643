"""Change points: a rank whose busy time per step shifts and stays shifted, named once with the step and the size.

An outlier is a rank slower than the others now; a change point is a rank that became slower (or faster) at some
step and stayed so: a CPU quota halved, a thermal throttle, a neighbour's job (Greyhound finds fail-slow ranks in
16 of 27 large jobs by change points in per-rank iteration time). Pure: no torch, no I/O.

The series. Under synchronous data parallelism every rank's step time carries the slowest rank's: the others wait
for it at the collectives, so one slowed rank shifts every rank's step time alike (a 40 ms straggle on rank 1 of 2
raised both ranks' step time by ~40 ms in tests/ranks/test_rank_shift_truth.py) and the step time alone cannot name
it. Its *busy time* can: step time less exposed communication (metrics.busy_s), the part of a step the rank spends
on its own work. The slowed rank's busy time rises; the others' exposed communication (their waiting) rises instead.
Without probes (`--probes off|system`) there is no exposed communication to take out and a shift shows on every
rank alike: job-wide, nobody is named.

The test, per rank, on its measured steps of one segment (no warm-up step, no sampled step: metrics' rule), restarted
at each segment (a switch changes every rank's step time) and after each shift it reports:
  1. two adjacent windows of WINDOW measured steps, A before B; the rank's noise is A's robust deviation
     σ = 1.4826 · MAD(A) (at least FLOOR of A's median: identical readings have no MAD);
  2. the shift is there when B's median and the medians of both of B's halves lie more than K·σ and a factor
     RATIO from A's median, on the same side (a two-window median test with a MAD scale, as robust change
     detectors use);
  3. where it started: the split of the last 2·WINDOW steps that best separates them into two levels (least
     absolute deviations from each side's median), so the step is found within a few steps, not when B filled;
     it is a change once a whole window of steps lies after that split and the test still holds: a level held
     for WINDOW measured steps, so a burst that ends sooner (a backup, a neighbour's compile) is none;
  4. against the others: the same steps' median busy time of the other ranks (each step's median over them) before
     and after; the rank is named only when its own ratio differs from theirs by RATIO and its shift in seconds from
     theirs by K·σ as well, so a job-wide change is blamed on no rank, whether it scales every rank's work (a slower
     clock) or adds to it (a neighbour's job on a shared host: +16 ms on both of 2 local ranks here, ×1.8 on a rank
     busy 20 ms a step but ×1.1 on one that sleeps 150 ms in its steps).
After a shift (named or job-wide) the rank's series restarts at the new level: the same shift is reported once, and
a shift back or further is a new one. Further means beyond the level the rank was last named at, by RATIO: a rank
whose CPU quota was halved went 20.6 → 38.8 ms, dipped to 31 (not RATIO back) and rose to 41, and the restarted
series saw 31 → 41 as a second shift (a lab CI run, 2026-11-28); against the 38.8 it was named at, it is none. Memory: 2·WINDOW values per rank and each step's sorted values for the last
HISTORY steps; a step costs two sorts of WINDOW values per rank.
"""

from __future__ import annotations

import bisect
import collections
import statistics
from typing import Iterable

from ddptop.events import ConfigApplied, Event, RankShifted, RunStarted, StepDone
from ddptop.metrics import DEFAULT_WARMUP, busy_s, in_warmup

WINDOW = 20  # measured steps on each side: a median of 20 has a standard deviation of ~0.28σ of one step's
K = 3.0  # the shift against the rank's own noise: two medians of 20 differ by 3σ (7.5 of their σ) by chance ~never
RATIO = 1.2  # and by a factor: Greyhound's fail-slow ranks ran 1.34× slower on average
FLOOR = 0.01  # σ at least 1% of the level: quantized or very steady readings have a MAD of 0
HISTORY = 4 * WINDOW  # steps whose every rank's busy time is kept for the other ranks' median
MAD_SCALE = 1.4826  # MAD × this estimates σ of normal noise
EVERY = 4  # the test runs at every 4th measured step of a rank (the split finds the step, not the test's timing):
#            6-11 µs a StepDone on average at 4 and at 1,024 ranks here (2 cores at a load average of 5), tests
#            included; 21 µs over the 80 steps around a job-wide change at 1,024 ranks, when every rank's split runs


def _median(values: list[float]) -> float:
    return statistics.median(values)


def _noise(values: list[float], level: float) -> float:
    return max(MAD_SCALE * _median([abs(v - level) for v in values]), FLOOR * abs(level))


def _shifted(before: float, sigma: float, after: float, sign: int) -> bool:
    """`after` lies beyond `before` by K·σ and the factor RATIO on the side `sign` (+1 slower, −1 faster)."""
    if before <= 0 or after <= 0:
        return False
    return sign * (after - before) > K * sigma and (after / before if sign > 0 else before / after) >= RATIO


def split(values: list[float], least: int = 3) -> int:
    """The index that best splits `values` into two levels: least absolute deviations from each side's median."""
    best, best_cost = least, float("inf")
    for k in range(least, len(values) - least + 1):
        left, right = values[:k], values[k:]
        ml, mr = _median(left), _median(right)
        cost = sum(abs(v - ml) for v in left) + sum(abs(v - mr) for v in right)
        if cost < best_cost:
            best, best_cost = k, cost
    return best


def median_without(ordered: list[float], value: float) -> float | None:
    """The median of the sorted list `ordered` with one occurrence of `value` taken out (None: nothing left)."""
    i = bisect.bisect_left(ordered, value)
    mine = i < len(ordered) and ordered[i] == value
    n = len(ordered) - mine
    if n <= 0:
        return None

    def at(j: int) -> float:
        return ordered[j + 1] if mine and j >= i else ordered[j]

    return (at((n - 1) // 2) + at(n // 2)) / 2


class ChangePoints:
    """Feed it every event (in order); `apply` returns the RankShifted events each one completes."""

    def __init__(self, warmup: int = DEFAULT_WARMUP):
        self.warmup = warmup
        self._first: dict[int, int] = {}  # segment → its first step (its switch's, else the first seen: metrics)
        self._series: dict[int, tuple[int, collections.deque]] = {}  # rank → (segment, its (step, busy) window)
        self._count: dict[int, int] = {}  # rank → its measured steps
        self._pending: dict[int, int] = {}  # rank → the step a shift not yet held for a window was found at
        self._named: dict[int, tuple[int, int, float]] = {}  # rank → (segment, side, level) it was last named at
        self._steps: collections.OrderedDict[tuple[int, int], list[float]] = collections.OrderedDict()

    def apply_all(self, events: Iterable[Event]) -> list[RankShifted]:
        return [shift for e in events for shift in self.apply(e)]

    def apply(self, event: Event) -> list[RankShifted]:
        if isinstance(event, StepDone):
            return self._step(event)
        if isinstance(event, RunStarted):
            self.warmup = event.warmup
        elif isinstance(event, ConfigApplied) and (event.rank == 0 or event.segment not in self._first):
            self._first[event.segment] = event.step
        return []

    def _step(self, d: StepDone) -> list[RankShifted]:
        first = self._first.setdefault(d.segment, d.step)
        if d.sampled or in_warmup(d.step, first, self.warmup):
            return []
        value = busy_s(d)
        key = (d.segment, d.step)
        if key not in self._steps:
            self._steps[key] = []
            while len(self._steps) > HISTORY:
                self._steps.popitem(last=False)
        bisect.insort(self._steps[key], value)
        segment, series = self._series.get(d.rank, (None, None))
        if segment != d.segment or series is None:
            self._pending.pop(d.rank, None)
            series = collections.deque(maxlen=2 * WINDOW)
            self._series[d.rank] = (d.segment, series)
        series.append((d.step, value))
        self._count[d.rank] = count = self._count.get(d.rank, 0) + 1
        if len(series) < 2 * WINDOW or count % EVERY:
            return []
        return self._test(d, series)

    def _test(self, d: StepDone, series: collections.deque) -> list[RankShifted]:
        values = [v for _, v in series]
        a, b = values[:WINDOW], values[WINDOW:]
        level = _median(a)
        sigma = _noise(a, level)
        after = _median(b)
        sign = 1 if after > level else -1
        half = WINDOW // 2
        if not (_shifted(level, sigma, after, sign) and _shifted(level, sigma, _median(b[:half]), sign)
                and _shifted(level, sigma, _median(b[half:]), sign)):
            self._pending.pop(d.rank, None)  # what was found before ended: a burst
            return []
        steps = [s for s, _ in series]
        pending = self._pending.get(d.rank)
        if pending is not None and pending in steps and len(steps) - steps.index(pending) < WINDOW:
            return []  # the split found before has not a window after it yet: no need to look again
        at = split(values)
        if len(values) - at < WINDOW:
            self._pending[d.rank] = steps[at]
            return []  # not yet a window at the new level: a burst that ends before is no change (tested again)
        self._pending.pop(d.rank, None)
        before, later = values[:at], values[at:]
        mine = (_median(before), _median(later))
        others = (self._others(d.segment, steps[:at], before), self._others(d.segment, steps[at:], later))
        # the rank's series restarts at its new level whether or not it is named: one report per shift
        series.clear()
        series.extend(zip(steps[at:], later))
        if None in others:
            return []  # no other rank's steps to tell a job-wide change from this rank's
        own_ratio = mine[1] / mine[0]
        their_ratio = others[1] / others[0] if others[0] > 0 else 1.0
        relative = own_ratio / their_ratio if their_ratio > 0 else own_ratio
        beyond = sign * ((mine[1] - mine[0]) - (others[1] - others[0]))
        if (relative if sign > 0 else 1 / relative) < RATIO or beyond <= K * sigma:
            return []  # the others shifted alike, by the factor or by the seconds: the job's change, not this rank's
        last = self._named.get(d.rank)
        if (last is not None and last[:2] == (d.segment, sign)
                and (mine[1] / last[2] if sign > 0 else last[2] / mine[1]) < RATIO):
            return []  # back at the level it was named at, after a dip that was no shift: the same shift
        self._named[d.rank] = (d.segment, sign, mine[1])
        return [RankShifted(rank=d.rank, segment=d.segment, step=steps[at], before_s=mine[0], after_s=mine[1],
                            others_before_s=others[0], others_after_s=others[1], steps=len(later), t=d.t)]

    def _others(self, segment: int, steps: list[int], mine: list[float]) -> float | None:
        """The median over `steps` of each step's median busy time of the other ranks (None: none reported)."""
        per_step = [m for step, value in zip(steps, mine)
                    if (ordered := self._steps.get((segment, step))) is not None
                    and (m := median_without(ordered, value)) is not None]
        return _median(per_step) if len(per_step) * 2 >= len(steps) else None
