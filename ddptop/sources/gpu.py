"""GPU readings through NVML (`pynvml`), or a short reason why there are none."""

from __future__ import annotations

import os
from typing import Any, Callable, Sequence

from ddptop.events import GpuStat

_REASONS = {  # NVMLError subclass name -> what the user should read
    "NVMLError_LibraryNotFound": "no NVIDIA driver (NVML library not found)",
    "NVMLError_DriverNotLoaded": "NVIDIA driver not loaded",
    "NVMLError_NoPermission": "no permission to query the GPU",
    "NVMLError_Uninitialized": "NVML not initialized",
}


class GpuReader:
    """Reads utilization, memory, power and temperature of the watched GPUs; never raises.

    `indices` are CUDA device indices as the trainer sees them (default: every GPU on the node). They are
    mapped through CUDA_VISIBLE_DEVICES, since NVML numbers GPUs like nvidia-smi and ignores that variable;
    GpuStat.index is the nvidia-smi index.
    """

    def __init__(self, indices: Sequence[int] | None = None, nvml: Any = None) -> None:
        self._indices = None if indices is None else tuple(indices)
        self._nvml = nvml  # injectable for tests; None imports pynvml on first read
        self._status: str | None = None  # None until the first read tries NVML
        self._devices: list[tuple[int, Any, str]] = []  # (nvidia-smi index, handle, name)
        self._initialized = False

    def read(self) -> tuple[str, tuple[GpuStat, ...]]:
        if self._status is None:
            self._status = self._open()
        if self._status != "ok":
            return self._status, ()
        return "ok", tuple(self._stat(*device) for device in self._devices)

    def close(self) -> None:
        if self._initialized:
            self._initialized = False
            self._status = "not available: closed"
            try:
                self._nvml.nvmlShutdown()
            except Exception:  # shutting down a broken driver must not stop the caller's shutdown
                pass

    def _open(self) -> str:
        try:
            if self._nvml is None:
                import pynvml

                self._nvml = pynvml
            self._nvml.nvmlInit()
        except ImportError:
            return "not available: pynvml not installed"
        except Exception as exc:
            return f"not available: {_reason(exc)}"
        self._initialized = True
        try:
            count = self._nvml.nvmlDeviceGetCount()
            targets = range(count) if self._indices is None else self._indices
            for cuda_index in targets:
                smi_index, handle = self._handle(cuda_index, count)
                if handle is not None:
                    self._devices.append((smi_index, handle, _text(self._nvml.nvmlDeviceGetName(handle))))
        except Exception as exc:
            return f"not available: {_reason(exc)}"
        if not self._devices:
            wanted = "" if self._indices is None else f" with index {', '.join(map(str, self._indices))}"
            return f"not available: no GPU{wanted} ({count} found)"
        return "ok"

    def _handle(self, cuda_index: int, count: int) -> tuple[int, Any]:
        target: int | str = cuda_index
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        if self._indices is not None and visible:
            entries = [e.strip() for e in visible.split(",") if e.strip()]
            if cuda_index >= len(entries):
                return cuda_index, None
            target = int(entries[cuda_index]) if entries[cuda_index].isdigit() else entries[cuda_index]
        if isinstance(target, str):  # a UUID ("GPU-8f3c...")
            handle = self._nvml.nvmlDeviceGetHandleByUUID(target)
            return self._nvml.nvmlDeviceGetIndex(handle), handle
        if not 0 <= target < count:
            return target, None
        return target, self._nvml.nvmlDeviceGetHandleByIndex(target)

    def _stat(self, index: int, handle: Any, name: str) -> GpuStat:
        nv = self._nvml
        util = self._metric(lambda: float(nv.nvmlDeviceGetUtilizationRates(handle).gpu))
        mem = self._metric(lambda: nv.nvmlDeviceGetMemoryInfo(handle))
        power_mw = self._metric(lambda: nv.nvmlDeviceGetPowerUsage(handle))
        temp = self._metric(lambda: float(nv.nvmlDeviceGetTemperature(handle, nv.NVML_TEMPERATURE_GPU)))
        return GpuStat(
            index=index,
            name=name,
            util_percent=util,
            mem_used_bytes=None if mem is None else int(mem.used),
            mem_total_bytes=None if mem is None else int(mem.total),
            power_w=None if power_mw is None else power_mw / 1000.0,
            temp_c=temp,
        )

    def _metric(self, read: Callable[[], Any]) -> Any:
        try:
            return read()
        except self._nvml.NVMLError:  # NotSupported (MIG, some boards), GpuIsLost: that field only
            return None


def _reason(exc: BaseException) -> str:
    return _REASONS.get(type(exc).__name__) or str(exc).strip() or type(exc).__name__


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)
