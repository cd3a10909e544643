"""Clocks for spans: host time on CPU, CUDA events on GPU resolved later without a sync every step."""

from __future__ import annotations

import time
from typing import Any, Callable


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

    def hold(self, tensor: Any) -> Any:
        """A copy of `tensor` (a step's loss) to read after the step's marks resolve; the training step never
        touches it again. On CPU the value is ready now."""
        return tensor.detach().clone()

    def synchronize(self) -> None:
        """Wait for the device once (the run's end): nothing to wait for on CPU."""


class CudaClock:
    """Marks are CUDA events on the current stream, so spans measure device time, not launch time.

    Reading them early would stall the host until the GPU catches up, so a step's marks are resolved on the
    telemetry publisher's thread, which waits for the step's last event; the training thread never syncs.
    """

    def __init__(self) -> None:
        import torch

        self._torch = torch
        self._event = torch.cuda.Event
        # torch.cuda.current_stream() walks Python device lookups (is_available, the NVML check) on every call: on an
        # H200 that was half of a mark's host time, and a sampled VGG-11 step takes ~130 marks. The C calls below
        # name the current device and its current stream's handle; the Stream object is rebuilt only when either
        # changes (a user's own `with torch.cuda.stream(...)`), so a mark still lands on the stream in force.
        self._device = getattr(torch._C, "_cuda_getDevice", None)
        self._raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        self._key: tuple[int, int] | None = None
        self._stream: Any = None

    def now(self) -> Any:
        event = self._event(enable_timing=True)
        event.record(self._current_stream())
        return event

    def _current_stream(self) -> Any:
        if self._device is None or self._raw is None:
            return None  # Event.record's own lookup
        index = self._device()
        key = (index, self._raw(index))
        if key != self._key:
            self._key, self._stream = key, self._torch.cuda.current_stream(index)
        return self._stream

    def ready(self, mark: Any) -> bool:
        return mark.query()

    def wait(self, mark: Any) -> None:
        mark.synchronize()  # releases the GIL; runs on the publisher thread

    def seconds(self, start: Any, end: Any) -> float:
        return start.elapsed_time(end) / 1000.0

    def hold(self, tensor: Any) -> Any:
        """An asynchronous copy of `tensor` into page-locked host memory, queued before the step's end mark: once
        that mark completes the value is there, so reading it never synchronizes (unlike `loss.item()`), and no
        later step can overwrite it."""
        host = self._torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
        host.copy_(tensor.detach(), non_blocking=True)
        return host

    def synchronize(self) -> None:
        """Once, at the run's end, before the last steps are resolved and flushed."""
        self._torch.cuda.synchronize()


def clock_for(device_type: str) -> CpuClock | CudaClock:
    return CudaClock() if device_type == "cuda" else CpuClock()


def wall_clock(offset_s: float = 0.0) -> Callable[[], float]:
    """The rank's wall clock (time.time), `offset_s` ahead under the test hook (testhooks.rank_hooks: clock=)."""
    if not offset_s:
        return time.time
    return lambda: time.time() + offset_s
