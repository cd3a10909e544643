"""Test-only hooks from DDPTOP_TEST_RANK (like DDPTOP_TEST_MODEL): a straggling rank, a rank whose clock is off, a rank
slow to start or to join."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Callable

from ddptop.errors import UsageError

ENV = "DDPTOP_TEST_RANK"
_FORMS = "(straggle=RANK:MS, clock=RANK:SECONDS, start=RANK:MS, join=RANK:MS)"


@dataclass(frozen=True)
class RankHooks:
    delay_s: float = 0.0  # slept before each collective this rank starts (its arrival comes that much later)
    clock_offset_s: float = 0.0  # added to this rank's wall clock (step and span times, its ping-pong answers)
    start_s: float = 0.0  # slept before its first step (a slow start: a Ctrl-C before any step can be aimed at)
    join_s: float = 0.0  # slept before a local rank joins the job (a Ctrl-C while the ranks start can be aimed at)


def rank_hooks(rank: int, value: str | None = None) -> RankHooks:
    """DDPTOP_TEST_RANK="straggle=1:40,clock=2:5,start=0:3000": rank 1 sleeps 40 ms before each collective, rank 2's
    wall clock reads 5 s ahead, rank 0 sleeps 3 s before its first step; `join=0:3000`: before it joins. Unset: no
    hook."""
    value = os.environ.get(ENV, "") if value is None else value
    delay = offset = start = join = 0.0
    for item in filter(None, (x.strip() for x in value.split(","))):
        key, _, rest = item.partition("=")
        who, _, amount = rest.partition(":")
        try:
            who_rank, number = int(who), float(amount)
        except ValueError:
            raise UsageError(f"{ENV}: bad item {item!r} {_FORMS}") from None
        if key not in ("straggle", "clock", "start", "join"):
            raise UsageError(f"{ENV}: unknown item {item!r} {_FORMS}")
        if who_rank == rank and key == "straggle":
            delay = number / 1000.0
        elif who_rank == rank and key == "start":
            start = number / 1000.0
        elif who_rank == rank and key == "join":
            join = number / 1000.0
        elif who_rank == rank:
            offset = number
    return RankHooks(delay, offset, start, join)


def wall_clock(offset_s: float = 0.0) -> Callable[[], float]:
    """The rank's wall clock (time.time), `offset_s` ahead under the test hook."""
    if not offset_s:
        return time.time
    return lambda: time.time() + offset_s
