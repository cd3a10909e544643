"""What a rank reads about its node: CPU, memory, NICs and GPUs, sampled by one background thread."""

from ddptop.sources.gpu import GpuReader
from ddptop.sources.sampler import SystemSampler
from ddptop.sources.system import CpuMem, CpuMemReader, NicTracker, job_interface, loopback_interface

__all__ = ["CpuMem", "CpuMemReader", "GpuReader", "NicTracker", "SystemSampler", "job_interface", "loopback_interface"]
