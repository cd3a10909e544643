"""Whether N emulated hosts fit on this machine, checked before anything is built: each host's share of the CPU,
and each host's rank in the memory that is available now.

`ddptop lab --nodes 200` on 2 cores was accepted at 0.01 CPU a host and was still starting after 120 s with ~19 GB
in use: a rank imports torch and holds its model, its data shard and gloo's buffers whatever its quota.
"""

from __future__ import annotations

import math
import os

import psutil

from ddptop.errors import UsageError
from ddptop.safe import read_text

MIN_CPU_PER_NODE = 0.25  # below this ranks spend minutes starting and miss their heartbeats: 20 resnet18 hosts at
# 0.1 CPU on 2 cores went silent for 120 s at step 0 and trained no step in 5 min; 4 hosts at 0.5 train (README)
# Memory one rank holds of its own (USS: not shared with the other ranks, unlike torch's libraries), measured on
# this 2-core machine at batch 64, 1 thread, --synthetic-size 640, gloo, after a few steps (psutil's
# memory_full_info every 0.3 s over a 2-rank job): tiny 417 MiB, vgg11 684-701, resnet18 1065-1109. Rounded down:
# a lab is refused only where it cannot fit; a larger data set or batch needs more (tiny at the default 50,000
# synthetic images: 690-755 MiB).
RANK_MIB = {"tiny": 400, "vgg11": 650, "resnet18": 1000}
FRONT_MIB = 280  # node 0's front process (store, collector, printer): USS 286-411 MiB in the same runs


def check_fits(nodes: int, cpus: float | None, model: str, cores: int) -> None:
    """UsageError (exit 2) in one line when `nodes` hosts cannot run here: a CPU share below MIN_CPU_PER_NODE
    (the quota, or the cores shared out when the quota is higher or unlimited), or ranks that need more memory
    than is available."""
    share = cores / nodes if cpus is None else min(cpus, cores / nodes)
    if share < MIN_CPU_PER_NODE - 1e-9:
        most = max(1, math.floor(cores / MIN_CPU_PER_NODE + 1e-9))
        given = f"--cpus-per-node {cpus:g}" if cpus is not None and cpus < cores / nodes else f"{cores} core(s)"
        raise UsageError(f"--nodes {nodes} does not fit here: {given} give each host {share:.2g} CPU, less than the "
                         f"{MIN_CPU_PER_NODE:g} a rank needs (at most {most} hosts on {cores} core(s))")
    per_rank = RANK_MIB.get(model, min(RANK_MIB.values()))
    available = available_mib()
    need = nodes * per_rank + FRONT_MIB
    if need > available:
        most = max(0, math.floor((available - FRONT_MIB) / per_rank))
        raise UsageError(f"--nodes {nodes} does not fit in memory: a {model} rank holds ≥ {per_rank} MiB of its own "
                         f"(measured), {nodes} × {per_rank} + the front's {FRONT_MIB} = {need / 1024:.1f} GiB, but "
                         f"{available / 1024:.1f} GiB is available (at most {most} hosts now)")


def available_mib() -> float:
    """Memory available to this process's cgroup now: the machine's (MemAvailable), or less where the memory
    cgroup ddptop runs in (a container, a systemd slice) is limited (v1 hierarchical limit, v2 memory.max)."""
    free = psutil.virtual_memory().available
    try:
        with open("/proc/self/cgroup") as f:
            lines = f.read().splitlines()
    except OSError:
        return free / 2**20
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):  # v1
            base = os.path.join("/sys/fs/cgroup/memory", path.lstrip("/"))
            rows = read_text(os.path.join(base, "memory.stat")).splitlines()
            stat = dict(row.split() for row in rows if " " in row)
            limit, used = stat.get("hierarchical_memory_limit"), read_text(os.path.join(base, "memory.usage_in_bytes"))
        elif controllers == "":  # v2 (in a v1 machine's hybrid layout its memory.max, if any, is never set)
            base = os.path.join("/sys/fs/cgroup", path.lstrip("/"))
            limit, used = (read_text(os.path.join(base, name)) for name in ("memory.max", "memory.current"))
        else:
            continue
        if limit and limit.strip().isdigit() and used.strip().isdigit():
            free = min(free, max(0, int(limit) - int(used)))
    return free / 2**20
