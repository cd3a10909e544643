"""GPU readings through NVML (`pynvml`), or a short reason why there are none."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from ddptop.events import GpuStat
from ddptop.sources import gpu_map

_REASONS = {  # NVMLError subclass name -> what the user should read
    "NVMLError_LibraryNotFound": "no NVIDIA driver (NVML library not found)",
    "NVMLError_DriverNotLoaded": "NVIDIA driver not loaded",
    "NVMLError_NoPermission": "no permission to query the GPU",
    "NVMLError_Uninitialized": "NVML not initialized",
}
KIB = 1024  # NVML gives PCIe throughput in KB/s and NVLink counters in KiB
ALL_LINKS = 0xFFFFFFFF  # a field's scopeId for the sum over every NVLink of the GPU
NVLINK_TX, NVLINK_RX = 138, 139  # NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX / _RX: counters in KiB


@dataclass
class _Device:
    index: int
    handle: Any
    name: str
    uuid: str
    nvlink: bool
    last: tuple[float, int, int] | None = field(default=None)  # (seconds, tx KiB, rx KiB) at the previous read


class GpuReader:
    """Reads every GpuStat field of the watched GPUs; never raises.

    `indices` are CUDA device indices as the trainer sees them (default: every GPU on the node, by NVML index);
    `uuids`, where given, are those devices' UUIDs as CUDA reports them, which identify the device whatever
    CUDA_VISIBLE_DEVICES and CUDA_DEVICE_ORDER say (see gpu_map). GpuStat.index is the nvidia-smi index.
    """

    def __init__(self, indices: Sequence[int] | None = None, nvml: Any = None,
                 uuids: Sequence[str | None] | None = None, env: Mapping[str, str] | None = None,
                 pid: int | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self._indices = None if indices is None else tuple(indices)
        self._uuids = tuple(uuids) if uuids is not None else (None,) * len(self._indices or ())
        self._nvml = nvml  # injectable for tests; None imports pynvml on first read
        self._env = os.environ if env is None else env
        self._pid = os.getpid() if pid is None else pid
        self._clock = clock
        self._status: str | None = None  # None until the first read tries NVML
        self._devices: list[_Device] = []
        self._initialized = False

    def read(self) -> tuple[str, tuple[GpuStat, ...]]:
        if self._status is None:
            self._status = self._open()
        if self._status != "ok":
            return self._status, ()
        return "ok", tuple(self._stat(device) for device in self._devices)

    def close(self) -> None:
        if self._initialized:
            self._initialized = False
            self._status = "not available: closed"
            try:
                self._nvml.nvmlShutdown()
            except Exception:  # shutting down a broken driver must not stop the caller's shutdown
                pass

    def _open(self) -> str:
        if self._indices == ():
            return "not available: this rank trains on the CPU"
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
        nv = self._nvml
        try:
            if self._indices is None:
                targets = [gpu_map.Target(i, nv.nvmlDeviceGetHandleByIndex(i), "")
                           for i in range(nv.nvmlDeviceGetCount())]
            else:
                targets = [gpu_map.find(nv, i, uuid, self._env) for i, uuid in zip(self._indices, self._uuids)]
            for t in targets:
                uuid = t.uuid or _text(self._metric(lambda: nv.nvmlDeviceGetUUID(t.handle)) or "")
                self._devices.append(_Device(t.index, t.handle, _text(nv.nvmlDeviceGetName(t.handle)), uuid,
                                             self._has_nvlink(t.handle)))
        except gpu_map.Unmapped as exc:
            return f"not available: {exc}"
        except Exception as exc:
            return f"not available: {_reason(exc)}"
        if not self._devices:
            return "not available: no GPU found"
        return "ok"

    def _has_nvlink(self, handle: Any) -> bool:
        nv = self._nvml
        for link in range(getattr(nv, "NVML_NVLINK_MAX_LINKS", 18)):
            try:
                if nv.nvmlDeviceGetNvLinkState(handle, link) == getattr(nv, "NVML_FEATURE_ENABLED", 1):
                    return True
            except Exception:  # NotSupported (no NVLink, MIG) or InvalidArgument past the device's links
                return False
        return False

    def _stat(self, d: _Device) -> GpuStat:
        nv, h = self._nvml, d.handle
        mem = self._metric(lambda: nv.nvmlDeviceGetMemoryInfo(h))
        power_mw = self._metric(lambda: nv.nvmlDeviceGetPowerUsage(h))
        energy_mj = self._metric(lambda: nv.nvmlDeviceGetTotalEnergyConsumption(h))
        pcie = [self._metric(lambda c=c: nv.nvmlDeviceGetPcieThroughput(h, c) * KIB)
                for c in (nv.NVML_PCIE_UTIL_RX_BYTES, nv.NVML_PCIE_UTIL_TX_BYTES)]
        nvlink = self._nvlink_rates(d) if d.nvlink else (None, None)
        return GpuStat(
            index=d.index,
            name=d.name,
            util_percent=self._metric(lambda: float(nv.nvmlDeviceGetUtilizationRates(h).gpu)),
            mem_used_bytes=None if mem is None else int(mem.used),
            mem_total_bytes=None if mem is None else int(mem.total),
            power_w=None if power_mw is None else power_mw / 1000.0,
            temp_c=self._metric(lambda: float(nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU))),
            sm_clock_mhz=self._metric(lambda: float(nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM))),
            pcie_rx_bytes_s=pcie[0], pcie_tx_bytes_s=pcie[1], nvlink_rx_bytes_s=nvlink[0],
            nvlink_tx_bytes_s=nvlink[1], proc_mem_bytes=self._metric(lambda: self._own_memory(h)), uuid=d.uuid,
            energy_j=None if energy_mj is None else energy_mj / 1000.0,
        )

    def _nvlink_rates(self, d: _Device) -> tuple[float | None, float | None]:
        """Bytes/s received and sent over NVLink since the previous read (None at the first)."""
        values = self._metric(lambda: self._nvml.nvmlDeviceGetFieldValues(d.handle, [(NVLINK_TX, ALL_LINKS),
                                                                                     (NVLINK_RX, ALL_LINKS)]))
        if values is None or any(v.nvmlReturn != 0 for v in values):
            return None, None
        now, tx, rx = self._clock(), int(values[0].value.ullVal), int(values[1].value.ullVal)
        last, d.last = d.last, (now, tx, rx)
        if last is None or now <= last[0] or tx < last[1] or rx < last[2]:  # first read, or counters reset
            return None, None
        seconds = now - last[0]
        return (rx - last[2]) * KIB / seconds, (tx - last[1]) * KIB / seconds

    def _own_memory(self, handle: Any) -> int | None:
        """GPU memory of this process (None when NVML does not see it: another PID namespace, Windows WDDM)."""
        for proc in self._nvml.nvmlDeviceGetComputeRunningProcesses(handle):
            if proc.pid == self._pid:
                return None if proc.usedGpuMemory is None else int(proc.usedGpuMemory)
        return None

    def _metric(self, read: Callable[[], Any]) -> Any:
        try:
            return read()
        except self._nvml.NVMLError:  # NotSupported (MIG, some boards), GpuIsLost: that field only
            return None


def cuda_uuid(index: int) -> str | None:
    """The UUID CUDA gives device `index` of this process (None where torch does not say)."""
    import torch

    try:
        return str(torch.cuda.get_device_properties(index).uuid) or None
    except (AttributeError, RuntimeError):
        return None


def _reason(exc: BaseException) -> str:
    return _REASONS.get(type(exc).__name__) or str(exc).strip() or type(exc).__name__


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)
