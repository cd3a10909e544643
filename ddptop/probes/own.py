"""ddptop's own cost: seconds the training work spends in ddptop code, collected per step phase."""

from __future__ import annotations

import time

now = time.perf_counter


class OwnTime:
    """Code that runs on the training path (marks, hooks, comm bookkeeping, the boundary exchange) adds the
    seconds it took; the step probe takes the total at every phase mark.

    `add` may run on another thread (a backend's completion thread, CUDA's autograd thread): list.append is
    atomic under the GIL, so nothing is lost and no lock is taken on the hot path."""

    __slots__ = ("_spent",)

    def __init__(self) -> None:
        self._spent: list[float] = []

    def add(self, seconds: float) -> None:
        self._spent.append(seconds)

    def since(self, start: float) -> None:
        """Add the time since `start` (a perf_counter value)."""
        self._spent.append(now() - start)

    def take(self) -> float:
        spent, self._spent = self._spent, []
        return sum(spent)
