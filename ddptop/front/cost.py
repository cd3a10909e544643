"""Provides FrontMeter: the front process's own CPU time per job step, read from the kernel every few seconds."""

from __future__ import annotations

import time
from typing import Callable

from ddptop.events import Event, FrontCost, StepDone

EVERY_S = 2.0  # a reading every 2 s while steps advance: the cost is a rate, not a per-step figure


class FrontMeter:
    """Fed every pump's events (front.pipeline.Derived), it returns a FrontCost when EVERY_S has passed and steps
    advanced: the CPU time the kernel counted for this whole process (every thread: the collector's decoding, the
    recorder, the screen) over the job steps finished since the last reading. While no step finishes (paused,
    starting, a switch) the baseline moves on: that CPU belongs to no step, and the screen says so by the state.
    The first EVERY_S after the first step sets the baseline: the front's start-up (its first snapshot, the rest of
    its imports) is not a step's cost (one run here: 2.7 ms a step over that interval, 0.3 after)."""

    def __init__(self, cpu: Callable[[], float] = time.process_time, clock: Callable[[], float] = time.monotonic):
        self._cpu, self._clock = cpu, clock
        self._newest = -1  # the newest step any rank finished
        self._base: tuple[float, int] | None = None  # (process CPU, newest step) at the last reading
        self._next: float | None = None  # None: no step yet; the first EVERY_S of steps is start-up's, not counted

    def __call__(self, events: list[Event]) -> list[Event]:
        for e in events:
            if type(e) is StepDone and e.step > self._newest:
                self._newest = e.step
        now = self._clock()
        if self._newest < 0:
            return []
        if self._next is None:  # the first step: the front is still settling (its first snapshot, imports)
            self._next = now + EVERY_S
            return []
        if now < self._next:
            return []
        self._next = now + EVERY_S
        cpu, base = self._cpu(), self._base
        self._base = (cpu, self._newest)
        if base is None or self._newest <= base[1]:
            return []
        return [FrontCost(cpu_s=max(0.0, cpu - base[0]), steps=self._newest - base[1], step=self._newest,
                          t=time.time())]
