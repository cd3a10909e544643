"""Each rank's memory by kind (issue 43) against what ddptop did not compute: a real 2-rank gloo job of the wide MLP,
recorded (each forward after a sleep: the samples come every 5 s whatever the steps' pace, and what a rank holds does
not depend on it, so the ranks idle through the test's 10 s instead of stepping). The parameters', gradients' and
optimizer state's bytes equal torch's own sizes of the same model built here (SGD with momentum: one buffer per
parameter once a step ran); the unique memory each rank reported agrees with /proc/PID/smaps_rollup read by this test
from the rank's process while it trains; the report's memory table and `info` (text and --json) say what SQL on the
recording says. Then, sharded storage: on 2 gloo ranks, FSDP2's fully_shard and ZeroRedundancyOptimizer (what
zero1/2/3 are built from) hold half of each kind where ddptop's count says so, against torch's local shards."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import psutil
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import ports
from procs import recording_rows, unique_memory, wait_while_running
from ddptop.examples.wide_mlp import mlp

DDPTOP = [sys.executable, "-m", "ddptop"]
PACE_S = 0.25  # slept before each forward: a step of the wide MLP is about 0.05 s of one core
PACED = f"""
import time

from torch import nn

from ddptop.examples.wide_mlp import mlp


class Paced(nn.Module):
    \"\"\"The wide MLP, each forward {PACE_S} s later: no parameter, buffer or state of its own.\"\"\"

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, x):
        time.sleep({PACE_S})
        return self.model(x)


def paced_mlp(num_classes=10):
    return Paced(mlp(num_classes))
"""








@pytest.fixture(scope="module")
def job(tmp_path_factory):
    """A recorded run; while it trains, each rank's unique memory read from /proc: (file, {rank: [(t, bytes)]})."""
    folder = tmp_path_factory.mktemp("memory")
    (folder / "paced.py").write_text(PACED)
    record = folder / "mem.db"
    proc = subprocess.Popen(DDPTOP + ["--headless", "--local", "2", "--backend", "gloo", "--model",
                                      "paced.py:paced_mlp", "--batch-size", "32", "--steps", "5000", "--no-eval",
                                      "--port", str(ports.port()), "--record", str(record)],
                            cwd=folder, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        def pids():
            meta = dict(recording_rows(record, "SELECT key, value FROM meta WHERE key = 'ranks'"))
            ranks = json.loads(meta["ranks"]) if "ranks" in meta else {}
            return {int(r): v["pid"] for r, v in ranks.items()} if len(ranks) == 2 else None

        by_rank = wait_while_running("both ranks joined", pids, proc)
        # past the first samples (each rank's step 0): the steady state of a training loop
        wait_while_running("a second memory sample of each rank", lambda: recording_rows(
            record, "SELECT rank FROM memory GROUP BY rank HAVING count(*) >= 2"), proc)
        read = {rank: [] for rank in by_rank}
        for _ in range(3):
            for rank, pid in by_rank.items():
                read[rank].append((time.time(), unique_memory(pid)))
            time.sleep(1.0)
        last = max(t for got in read.values() for t, _ in got)
        wait_while_running("a memory sample after the readings", lambda: recording_rows(
            record, "SELECT rank FROM memory WHERE t > ? GROUP BY rank HAVING count(*) >= 1", (last,)) and len(
            recording_rows(record, "SELECT DISTINCT rank FROM memory WHERE t > ?", (last,))) == 2, proc)
        proc.send_signal(signal.SIGTERM)  # a stop: the ranks finish their step, the recording is closed
        out, _ = proc.communicate(timeout=120)
        assert proc.returncode == 0, out[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return record, read


def test_the_recorded_bytes_are_torchs_sizes_of_the_same_model(job):
    record, _ = job
    model = mlp()
    size = sum(p.numel() * p.element_size() for p in model.parameters())
    rows = recording_rows(record, "SELECT rank, step, param_bytes, grad_bytes, optim_bytes, by FROM memory")
    assert {r for r, *_ in rows} == {0, 1} and len(rows) >= 6
    # every sample, the first (step 0's end, the momentum just made) too: DDP holds a whole copy of each kind
    assert {tuple(r[2:]) for r in rows} == {(size, size, size, "process USS")}, rows
    assert {step for r, step, *_ in rows if step == 0} == {0}


def test_the_recorded_unique_memory_agrees_with_the_kernels_within_20_percent(job):
    record, read = job
    for rank, readings in read.items():
        samples = recording_rows(record, "SELECT t, now_bytes, peak_bytes FROM memory WHERE rank = ? AND step > 0", (rank,))
        for t, uss in readings:
            _, now, peak = min(samples, key=lambda s: abs(s[0] - t))  # the sample nearest the reading
            assert abs(now - uss) <= 0.2 * uss, (rank, now, uss)
            assert peak == now  # on a CPU the peak is the step end's read (the largest over a segment: metrics)


def _sql_table(record) -> list[tuple]:
    """(segment, rank, params, grads, optimizer, peak, samples): the latest sample's kinds, the largest peak."""
    return recording_rows(record, """
        SELECT m.segment, m.rank, m.param_bytes, m.grad_bytes, m.optim_bytes, agg.peak, agg.n
        FROM memory m JOIN (SELECT segment, rank, max(seq) AS seq, max(peak_bytes) AS peak, count(*) AS n
                            FROM memory GROUP BY segment, rank) agg ON m.seq = agg.seq ORDER BY m.segment, m.rank""")


def test_the_reports_memory_table_and_info_say_what_sql_says(job, tmp_path):
    record, _ = job
    expected = _sql_table(record)
    assert len(expected) == 2
    result = subprocess.run(DDPTOP + ["report", "-o", str(tmp_path / "report"), "--formats", "png", str(record)],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    text = (tmp_path / "report" / "report.md").read_text()
    section = text.split("## Memory per rank", 1)[1].split("\n## ", 1)[0]
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in section.splitlines()
            if line.startswith("|") and not set(line) <= set("|-: ")]
    assert rows[0][:8] == ["run", "segment", "rank", "parameters B", "gradients B", "optimizer state B", "peak B",
                           "reserved B"]
    got = [(int(r[1]), int(r[2]), int(r[3]), int(r[4]), int(r[5]), int(r[6]), int(r[8])) for r in rows[1:]]
    assert got == expected
    glossary = text.split("## Glossary", 1)[1]
    assert all(f"| {term} |" in glossary for term in ("parameters held", "gradients held", "optimizer state held",
                                                        "peak memory")), glossary
    info = subprocess.run(DDPTOP + ["info", "--json", str(record)], capture_output=True, text=True, timeout=120)
    assert info.returncode == 0, info.stderr
    held = json.loads(info.stdout)["memory"]
    assert [(m["segment"], m["rank"], m["param_bytes"], m["grad_bytes"], m["optim_bytes"], m["peak_bytes"],
             m["samples"]) for m in held] == expected
    lines = subprocess.run(DDPTOP + ["info", str(record)], capture_output=True, text=True, timeout=120).stdout
    for segment, rank, params, grads, optim, peak, _ in expected:
        assert (f"segment {segment} rank {rank}: params {params / 1e6:.1f}, grads {grads / 1e6:.1f}, optimizer "
                f"{optim / 1e6:.1f}, peak {peak / 1e6:.1f} (process USS)") in lines
    count, cost = recording_rows(record, "SELECT count(*), max(cost_s) FROM memory")[0]
    assert re.search(rf"\b{count} memory samples\b", lines)
    assert f"a sample took the training thread up to {cost * 1e3:.1f} ms" in lines  # ddptop's own cost, said


# -- sharded storage: what zero1/2/3 are built from, counted by ddptop's probe on real gloo ranks ----------------------

def _sharded(rank: int, port: int, out) -> None:
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.optim import ZeroRedundancyOptimizer

    from ddptop.probes.memory import held_bytes, local

    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        torch.manual_seed(0)
        model = mlp()
        for block in model:  # each top-level block a unit, as zero2/zero3 shard by default
            if any(True for _ in block.parameters()):
                fully_shard(block)
        fully_shard(model)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        model(torch.randn(8, 3, 32, 32)).sum().backward()
        optimizer.step()
        # torch's own view of the shard: each DTensor's to_local(), its gradient's, its momentum's
        shards = [(p.to_local(), p.grad.to_local(), optimizer.state[p]["momentum_buffer"].to_local())
                  for p in model.parameters()]
        truth = tuple(sum(t[i].numel() * t[i].element_size() for t in shards) for i in range(3))
        fsdp = (held_bytes(model, optimizer), truth, local(next(model.parameters())).shape[0])

        torch.manual_seed(0)
        plain = mlp()
        zero = ZeroRedundancyOptimizer(plain.parameters(), optimizer_class=torch.optim.SGD, lr=0.1, momentum=0.9)
        plain(torch.randn(8, 3, 32, 32)).sum().backward()
        zero.step()
        mine = sum(t.numel() * t.element_size() for s in zero.optim.state.values() for t in s.values()
                   if isinstance(t, torch.Tensor))
        out.put((rank, fsdp, (held_bytes(plain, zero), mine)))
    finally:
        dist.destroy_process_group()


def _forked_ranks(port: int, out) -> None:
    """A fresh process (spawned) imports torch and what fully_shard imports on its first call (torch._dynamo) once,
    then forks the two ranks: no thread, no parallel op ran here yet, as in ddptop's own fork server."""
    import torch._dynamo  # noqa: F401
    import torch.distributed.fsdp  # noqa: F401
    import torch.distributed.optim  # noqa: F401

    import ddptop.probes.memory  # noqa: F401

    mp.start_processes(_sharded, args=(port, out), nprocs=2, join=True, start_method="fork")


def test_sharded_parameters_gradients_and_state_count_the_ranks_own_shard():
    spawn = mp.get_context("spawn")
    queue = spawn.SimpleQueue()
    launcher = spawn.Process(target=_forked_ranks, args=(ports.port(), queue))
    launcher.start()
    try:
        launcher.join(300)
        assert launcher.exitcode == 0, f"the ranks failed (their traceback above) or ran past 300 s: {launcher.exitcode}"
    finally:
        if launcher.is_alive():
            for child in psutil.Process(launcher.pid).children(recursive=True):
                child.kill()
            launcher.kill()
            launcher.join()
    got = dict((rank, rest) for rank, *rest in [queue.get() for _ in range(2)])
    size = sum(p.numel() * p.element_size() for p in mlp().parameters())
    for rank, ((counted, truth, rows), (zero_counted, zero_mine)) in got.items():
        assert counted == truth, rank  # FSDP2: the local shards, as torch's to_local() gives them
        assert rows == 256  # Linear(3072, 512)'s weight: half its 512 rows on each rank
        assert zero_counted == (size, size, zero_mine)  # ZeRO-1: whole parameters and gradients, its own state
    assert sum(got[r][0][0][0] for r in got) == size  # the shards add up to the whole model once
    assert sum(got[r][1][1] for r in got) == size  # and so do ZeRO-1's momentum shards
