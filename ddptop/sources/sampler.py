"""The one background thread per rank that reads the node and hands a SystemSample to a sink."""

from __future__ import annotations

import sys
import threading
import time
from typing import Callable, Sequence, TypeVar

from ddptop.events import SystemSample
from ddptop.sources.gpu import GpuReader
from ddptop.sources.system import CpuMem, CpuMemReader, NicTracker, nic_speeds

T = TypeVar("T")
_NO_CPU_MEM = CpuMem(0.0, 0.0, 0, 0, 0)


class SystemSampler:
    """Every `interval_s`, reads CPU, memory, NICs and GPUs and calls `sink(sample)` from a daemon thread.

    A failing reader (or sink) skips its part of that sample and is reported on stderr once; the thread
    keeps going. One sample costs well under a millisecond of CPU (psutil reads a few /proc files); on a GPU,
    NVML's PCIe throughput takes 20 ms per direction, time this thread waits, not CPU.
    """

    def __init__(
        self,
        rank: int,
        host: str,
        job_iface: str,
        sink: Callable[[SystemSample], None],
        interval_s: float = 0.5,
        gpu_indices: Sequence[int] | None = None,
        gpu_uuids: Sequence[str | None] | None = None,
    ) -> None:
        if interval_s <= 0:
            raise ValueError(f"interval_s must be positive, got {interval_s}")
        self.rank, self.host, self.job_iface = rank, host, job_iface
        self.interval_s = interval_s
        self._sink = sink
        self._cpu = CpuMemReader()
        self._nics = NicTracker(speeds=lambda: nic_speeds(job_iface))  # totals count from here: the run's start
        self._gpu = GpuReader(gpu_indices, uuids=gpu_uuids)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._reported: set[str] = set()

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=f"ddptop-sampler-{self.rank}", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        """Stop the thread and wait for it (idempotent)."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=max(5.0, 4 * self.interval_s))
        self._gpu.close()

    def sample(self) -> SystemSample:
        """One reading now; what fails is left out (zeros for CPU/memory, no NICs, no GPUs)."""
        cpu = self._guard("cpu/memory", self._cpu.read, _NO_CPU_MEM)
        nics = self._guard("network counters", self._nics.sample, ())
        gpu_status, gpus = self._guard("gpu", self._gpu.read, ("not available: reading failed", ()))
        return SystemSample(
            rank=self.rank,
            host=self.host,
            t=time.time(),
            proc_cpu_percent=cpu.proc_cpu_percent,
            node_cpu_percent=cpu.node_cpu_percent,
            proc_rss_bytes=cpu.proc_rss_bytes,
            node_mem_used_bytes=cpu.node_mem_used_bytes,
            node_mem_total_bytes=cpu.node_mem_total_bytes,
            job_iface=self.job_iface,
            nics=nics,
            gpus=gpus,
            gpu_status=gpu_status,
            node_cpu_quota=cpu.node_cpu_quota,
        )

    def _run(self) -> None:
        self._guard("cpu/memory", self._cpu.prime, None)  # psutil's node CPU baseline is per thread
        deadline, sent = time.monotonic(), False
        while True:
            # fixed cadence: a slow sample does not push every later one back
            deadline = max(deadline + self.interval_s, time.monotonic())
            if self._stop.wait(deadline - time.monotonic()) and sent:
                return
            sample = self.sample()  # a rank that ends before its first interval still says its system once
            self._guard("sink", lambda: self._sink(sample), None)
            if self._stop.is_set():
                return
            sent = True

    def _guard(self, what: str, read: Callable[[], T], fallback: T) -> T:
        try:
            return read()
        except Exception as exc:
            if what not in self._reported:
                self._reported.add(what)
                message = f"ddptop: rank {self.rank}: system sampler: {what} failed, skipped (shown once): {exc!r}"
                print(message, file=sys.stderr)
            return fallback
