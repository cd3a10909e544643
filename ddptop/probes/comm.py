"""Communication spans: strategies stamp each collective's start and completion here."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

from ddptop.probes.clock import CpuClock
from ddptop.probes.own import OwnTime, now


@dataclass
class CommMark:
    """One collective with unresolved clock marks (floats on CPU, CUDA events on GPU)."""

    name: str
    start: Any
    end: Any
    nbytes: int
    tx_bytes: int
    rx_bytes: int
    kind: str = "comm"
    blocking: bool = False  # the training thread waited inside it: no compute ran beside it (timeline.breakdown)


class CommRecorder:
    """Collects the collectives of the current step. `add` may be called from a backend's thread (DDP hooks).

    The time spent here is ddptop's own cost and goes to `own` (a step probe shares its OwnTime)."""

    enabled = True
    delay_s = 0.0  # the test hook's straggle (testhooks.rank_hooks): slept before each arrival

    def __init__(self, clock: Any = None, own: OwnTime | None = None):
        self.clock = clock or CpuClock()
        self.own = own or OwnTime()
        self._marks: list[CommMark] = []
        self._lock = threading.Lock()

    def now(self) -> Any:
        return self.clock.now()

    def arrive(self) -> Any:
        """A collective's start mark, stamped as the rank calls it: its arrival, whose spread across ranks names a
        straggler (metrics.stragglers). Under the test hook the rank sleeps first, so it arrives that much later."""
        if self.delay_s:
            time.sleep(self.delay_s)
        return self.now()

    def add(self, name: str, start: Any, end: Any, nbytes: int, tx: int, rx: int, kind: str = "comm",
            blocking: bool = False) -> None:
        began = now()
        with self._lock:
            self._marks.append(CommMark(name, start, end, nbytes, tx, rx, kind, blocking))
        self.own.since(began)

    def take(self) -> list[CommMark]:
        """The marks so far; the recorder starts empty for the next step."""
        with self._lock:
            marks, self._marks = self._marks, []
        return marks


class NullRecorder(CommRecorder):
    """`--probes off|system`: strategies call the same methods, nothing is measured."""

    enabled = False

    def now(self) -> Any:
        return 0.0

    def arrive(self) -> Any:
        if self.delay_s:  # the straggle is the job's, measured or not
            time.sleep(self.delay_s)
        return 0.0

    def add(self, *args: Any, **kwargs: Any) -> None:
        return None
