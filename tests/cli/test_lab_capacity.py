"""`ddptop lab` refuses, in one line and exit 2, a cluster that cannot run here, before it builds anything: hosts
whose CPU share is below the minimum, ranks that need more memory than the cgroup it runs in allows."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time

import pytest

from calibrate import Calibrated

from ddptop.lab.capacity import MIN_CPU_PER_NODE
from ddptop.lab.cluster import machine_cores

from test_run_cli import DDPTOP


def namespaces() -> str:
    return subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout


def lab(argv: list[str], tmp_path, prefix: list[str] = ()) -> subprocess.CompletedProcess:
    env = {**os.environ, "DDPTOP_LAB_DIR": str(tmp_path / "state")}
    before = namespaces()
    cal = Calibrated()
    start = time.monotonic()
    # --check: where a lab is (wrongly) built anyway, it measures and removes itself instead of training
    done = subprocess.run([*prefix, *DDPTOP, "lab", *argv, "--check"], capture_output=True, text=True, timeout=120,
                          env=env)
    took = time.monotonic() - start
    cal.again()
    assert took < cal.bound(30) and namespaces() == before, (took, cal.factor)  # at once, creating nothing
    assert not (tmp_path / "state").exists() or not os.listdir(tmp_path / "state")
    return done


@pytest.mark.skipif(os.geteuid() != 0, reason="a lab needs root")
def test_more_hosts_than_the_cores_can_share_are_refused(tmp_path):
    nodes = int(machine_cores() / MIN_CPU_PER_NODE) + 1  # 9 on 2 cores (0.22 CPU each)
    for argv in (["--nodes", str(nodes), "--cpus-per-node", "unlimited"], ["--nodes", "200"]):
        done = lab([*argv, "--model", "tiny"], tmp_path)
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 2 and len(lines) == 1, done.stderr
        assert re.match(rf"ddptop: --nodes {argv[1]} does not fit here: .* less than the {MIN_CPU_PER_NODE:g} a "
                        rf"rank needs \(at most {nodes - 1} hosts", lines[0]), lines[0]


def own_memory_cgroup() -> str | None:
    for line in open("/proc/self/cgroup").read().splitlines():
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            return os.path.join("/sys/fs/cgroup/memory", path.lstrip("/"))
    return None


@pytest.mark.skipif(os.geteuid() != 0 or not own_memory_cgroup(), reason="needs root and a cgroup v1 memory controller")
def test_ranks_that_need_more_memory_than_the_cgroup_allows_are_refused(tmp_path):
    cgroup = os.path.join(own_memory_cgroup(), f"ddptop-test-{os.getpid()}")
    os.mkdir(cgroup)
    try:
        with open(os.path.join(cgroup, "memory.limit_in_bytes"), "w") as f:
            f.write(str(3 << 30))  # 3 GiB: less than 4 resnet18 ranks and the front hold
        join = ["sh", "-c", f'echo $$ > {cgroup}/cgroup.procs && exec "$@"', "sh"]
        done = lab(["--nodes", "4", "--model", "resnet18"], tmp_path, join)
    finally:
        os.rmdir(cgroup)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    m = re.match(r"ddptop: --nodes 4 does not fit in memory: .* but ([\d.]+) GiB is available", lines[0])
    assert m and float(m.group(1)) <= 3.0, lines[0]  # the cgroup's limit, not the machine's free memory
