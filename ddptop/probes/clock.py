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

    def seconds(self, start: Any, end: Any) -> float:
        return end - start


class CudaClock:
    """Marks are CUDA events on the current stream, so spans measure device time, not launch time.

    Reading them early would stall the host until the GPU catches up; the trainer keeps a step's
    marks until `ready` says the last one completed (usually one step later) and resolves them then.
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

    def seconds(self, start: Any, end: Any) -> float:
        return start.elapsed_time(end) / 1000.0


def clock_for(device_type: str) -> CpuClock | CudaClock:
    return CudaClock() if device_type == "cuda" else CpuClock()
