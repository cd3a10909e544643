"""CPU quotas per emulated host: a cgroup each, cgroup v1 `cpu.cfs_quota_us` or v2 `cpu.max`, whichever is here."""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass

from ddptop.errors import LabUnavailable
from ddptop.safe import read_text

# quota C cores = C × 10 ms of CPU every 10 ms. The kernel's default 100 ms lets a half-core host run flat out for
# 50 ms and then stop for 50 ms, and every collective waits for a stopped peer; 10 ms makes it behave more like a
# slower core (VGG-11, 4 hosts, 2 interleaved pairs of runs: DDP / all_reduce step time 0.91 and 0.62 at 10 ms,
# 1.00 and 0.78 at 100 ms)
PERIOD_US = 10_000
# A host's CPU weight, 64× the default (cgroup v1 cpu.shares 1024, v2 cpu.weight 100): a quota is a ceiling, not a
# guarantee, and with 4 other busy processes on this 2-core machine a 0.5-core host got 0.40 core (its fair share of
# 5) and the cs744-lab order broke (DDP 2.39 s/step pooled against all_reduce 2.37). At 64× the host keeps its quota
# unless 64 other processes compete (tests/lab/test_cgroup_weight.py): an emulated host is a machine of its own.
WEIGHT_TIMES = 64


@dataclass(frozen=True)
class CpuController:
    """Where this machine's CPU controller is mounted, and which cgroup version it speaks."""

    version: int  # 1 or 2
    root: str

    def path(self, name: str) -> str:
        return os.path.join(self.root, name)

    def create(self, name: str, cpus: float) -> str:
        """A new cgroup limited to `cpus` cores; LabUnavailable if the kernel refuses."""
        path = self.path(name)
        try:
            os.mkdir(path)
            self.limit(path, cpus)
            if self.version == 1:
                _write(os.path.join(path, "cpu.shares"), str(1024 * WEIGHT_TIMES))
            else:
                _write(os.path.join(path, "cpu.weight"), str(100 * WEIGHT_TIMES))
        except OSError as exc:
            raise LabUnavailable(f"cannot make a CPU quota cgroup at {path}: {exc.strerror or exc}") from None
        return path

    def limit(self, path: str, cpus: float) -> None:
        """Set the cgroup's quota to `cpus` cores, at its making or later, while its processes run (a host
        that becomes slower mid-run: tests/lab/test_change_point_lab.py). OSError if the kernel refuses."""
        quota = max(1000, int(cpus * PERIOD_US))
        if self.version == 1:
            _write(os.path.join(path, "cpu.cfs_period_us"), str(PERIOD_US))
            _write(os.path.join(path, "cpu.cfs_quota_us"), str(quota))
        else:
            _write(os.path.join(path, "cpu.max"), f"{quota} {PERIOD_US}")

    def describe(self) -> str:
        return f"cgroup v{self.version} {'cpu.cfs_quota_us' if self.version == 1 else 'cpu.max'}"


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def _mounts() -> list[tuple[str, str, list[str]]]:
    """(mount point, type, options) of every cgroup mount."""
    out = []
    try:
        with open("/proc/self/mounts") as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 4 and parts[2] in ("cgroup", "cgroup2"):
                    out.append((parts[1].replace("\\040", " "), parts[2], parts[3].split(",")))
    except OSError:
        pass
    return out


def find_controller() -> CpuController | str:
    """The CPU controller (v2 when it has `cpu`, else v1's cpu hierarchy), or the reason there is none."""
    mounts = _mounts()
    for point, kind, _ in mounts:
        if kind == "cgroup2" and "cpu" in read_text(os.path.join(point, "cgroup.controllers")).split():
            if "cpu" not in read_text(os.path.join(point, "cgroup.subtree_control")).split():
                return f"the cgroup v2 cpu controller is not enabled for child cgroups of {point}"
            return CpuController(2, point)
    for point, kind, options in mounts:
        if kind == "cgroup" and "cpu" in options:
            return CpuController(1, point)
    return "no cgroup CPU controller is mounted (cgroup v1 `cpu` or v2 with `cpu` in cgroup.controllers)"


def add_process(path: str, pid: int) -> bool:
    """Move a process (all its threads) into the cgroup; False if it is gone."""
    try:
        _write(os.path.join(path, "cgroup.procs"), str(pid))
        return True
    except OSError:
        return False


def pids(path: str) -> list[int]:
    return [int(p) for p in read_text(os.path.join(path, "cgroup.procs")).split() if p.isdigit()]


def remove(path: str, wait_s: float = 5.0) -> bool:
    """Kill what is left inside and remove the cgroup; True when it is gone."""
    deadline = time.monotonic() + wait_s
    while os.path.isdir(path):
        for pid in pids(path):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        try:
            os.rmdir(path)
        except OSError:  # EBUSY while killed tasks are still leaving
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)
    return True

