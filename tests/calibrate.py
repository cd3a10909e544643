"""A same-run calibration for the few tests that bound a wall time: how much slower than this project's development
machine, quiet, this machine runs Python right now (slower cores, or other work on them).

A bound such as "a killed worker's job is gone within 10 s" separates two mechanisms (a process exit noticed at once
against a 30 s timeout); on a machine twice as slow, or with a neighbour on every core, everything in the test takes
longer, the mechanism included. `Calibrated` times a fixed pure-Python loop just before and just after the measured
interval, and scales the nominal bound by the larger slowdown: the verdict no longer depends on the machine's speed.
"""

from __future__ import annotations

import time

NOMINAL_S = 0.10  # _loop() on the development machine (2 cores), quiet: 0.09-0.14 s of CPU, the same wall time
MAX_FACTOR = 20.0  # a machine 20x slower than that is not one a bound can say anything about: fail instead


def _loop(n: int = 2_000_000) -> int:
    total = 0
    for i in range(n):
        total += i
    return total


def slowdown() -> float:
    """This machine's wall time for the loop now, over the development machine's; at least 1."""
    start = time.perf_counter()
    _loop()
    return max(1.0, (time.perf_counter() - start) / NOMINAL_S)


class Calibrated:
    """`with Calibrated() as cal: ...` then `cal.bound(nominal_s)`: the nominal bound times the slowdown measured
    before and after the block (the larger). A slowdown past MAX_FACTOR fails the test with both figures."""

    def __init__(self) -> None:
        self.factors = [slowdown()]

    def __enter__(self) -> "Calibrated":
        return self

    def __exit__(self, *exc) -> None:
        self.again()

    def again(self) -> None:
        """Measure once more (the end of the interval, where a `with` block does not fit)."""
        self.factors.append(slowdown())

    @property
    def factor(self) -> float:
        return max(self.factors)

    def bound(self, nominal_s: float) -> float:
        assert self.factor <= MAX_FACTOR, f"this machine runs {self.factor:.1f}x slower than the calibration allows"
        return nominal_s * self.factor
