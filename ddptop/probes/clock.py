"""Clocks for spans: host time on CPU, CUDA events on GPU resolved later without a sync every step."""

from __future__ import annotations

import time
from typing import Any


class CpuClock:
    """Marks are perf_counter floats; a mark is ready as soon as it is taken."""

    def now(self) -> float:
        return time.perf_counter()

    def ready(self, mark: Any) -> bool:
        return True

    def wait(self, mark: Any) -> None:
        """Block until `mark` can be read (the resolving thread, never the training thread, calls this)."""

    def seconds(self, start: Any, end: Any) -> float:
        return end - start


class CudaClock:
    """Marks are CUDA events on the current stream, so spans measure device time, not launch time.

    Reading them early would stall the host until the GPU catches up, so a step's marks are resolved on the
    telemetry publisher's thread, which waits for the step's last event; the training thread never syncs.
    """

    def __init__(self) -> None:
        import torch

        self._torch = torch

    def now(self) -> Any:
        event = self._torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def ready(self, mark: Any) -> bool:
        return mark.query()

    def wait(self, mark: Any) -> None:
        mark.synchronize()  # releases the GIL; runs on the publisher thread

    def seconds(self, start: Any, end: Any) -> float:
        return start.elapsed_time(end) / 1000.0


def clock_for(device_type: str) -> CpuClock | CudaClock:
    return CudaClock() if device_type == "cuda" else CpuClock()
