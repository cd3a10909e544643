"""Provides the front's CPU time per job step, one definition for the screen, `info` and the report (issue 42)."""

from __future__ import annotations

from typing import Iterable

from ddptop.events import FrontCost


def front_per_step(readings: Iterable[FrontCost]) -> tuple[float, int]:
    """(CPU seconds per job step, steps covered) over FrontCost readings: their CPU summed over their steps summed,
    so a reading over many steps weighs as many. (0.0, 0) where there is none (a recording from before issue 42,
    a replay's own process, or a run that never finished a step after its first reading)."""
    cpu = steps = 0
    for r in readings:
        cpu += r.cpu_s
        steps += r.steps
    return (cpu / steps, steps) if steps else (0.0, 0)
