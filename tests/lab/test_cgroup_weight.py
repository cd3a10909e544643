"""A lab host keeps its CPU quota while other work runs on the machine (lab/cgroups.py WEIGHT_TIMES).

Ground truth is the kernel's own CPU time of a busy process inside a host's cgroup (/proc/PID/stat utime+stime),
measured while 4 busy processes run outside any lab cgroup on this 2-core machine. Without the weight the host's
process gets its fair share of 5 (0.40 core); with it, its 0.5-core quota. Alone phase: it measures CPU shares.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid

import pytest

from ddptop.lab import cgroups
from tests.labs import LAB_REFUSED

pytestmark = pytest.mark.skipif(bool(LAB_REFUSED), reason=LAB_REFUSED or "lab available")

SPIN = [sys.executable, "-c", "while True: pass"]
QUOTA = 0.5
OUTSIDE = max(4, 2 * (os.cpu_count() or 2))  # busy processes outside: more than the cores, so the host must compete


def _cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def test_a_host_gets_its_quota_while_more_busy_processes_than_cores_run_outside():
    controller = cgroups.find_controller()
    path = controller.create(f"ddplab-weight-{uuid.uuid4().hex[:6]}", QUOTA)
    procs = []
    try:
        host = subprocess.Popen(SPIN)
        procs.append(host)
        assert cgroups.add_process(path, host.pid)
        procs += [subprocess.Popen(SPIN) for _ in range(OUTSIDE)]
        time.sleep(0.5)  # all running
        c0, t0 = _cpu_s(host.pid), time.monotonic()
        time.sleep(3.0)
        share = (_cpu_s(host.pid) - c0) / (time.monotonic() - t0)
    finally:
        for p in procs:
            p.kill()
            p.wait()
        cgroups.remove(path)
    fair = min(QUOTA, (os.cpu_count() or 2) / (OUTSIDE + 1))
    # the quota within 8%: clock ticks (10 ms) over 3 s and the 10 ms period's edges; the fair share is 0.2-0.4 here
    assert share >= 0.92 * QUOTA, f"the host got {share:.2f} core of its {QUOTA} quota (fair share {fair:.2f})"
    assert share <= 1.05 * QUOTA, f"the host got {share:.2f} core, over its {QUOTA} quota"
