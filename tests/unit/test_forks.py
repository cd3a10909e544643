"""front/forks.py: when `ddptop` forks its CPU ranks' server out of itself, OpenMP in that server (and so in every rank
and every thread gloo starts in a rank) uses the ranks' thread count, which only an OMP_NUM_THREADS set before torch
loads gives. Read from libgomp itself in a fresh thread, as gloo's threads would read it."""

from __future__ import annotations

import glob
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

import ports
from ddptop.front import forks
from ddptop.train import devices

ROOT = Path(__file__).resolve().parents[2]

# The OpenMP thread count a new thread of this process gets (libgomp's global default, read once at load).
FRESH_THREAD = """
import ctypes, threading
def fresh_thread_omp():
    path = next(line.split()[-1] for line in open("/proc/self/maps") if "libgomp" in line)
    gomp, out = ctypes.CDLL(path), []
    t = threading.Thread(target=lambda: out.append(gomp.omp_get_max_threads()))
    t.start()
    t.join()
    return out[0]
"""

# The real command up to the moment it forks the server: there it prints what a forked rank's threads would get.
AT_THE_FORK = FRESH_THREAD + """
import os, sys
from ddptop.front import forks
def start():
    print(f"omp={fresh_thread_omp()} torch_before={sys.modules.get('torch') is not None}", flush=True)
    os._exit(0)
forks.start = start
from ddptop.cli import main
sys.exit(main(["--local", "2", "--threads", "1", "--model", "tiny", "--steps", "1", "--headless", "--no-record"]))
"""

# The control: the same variable set once torch has loaded changes nothing for a new thread.
TOO_LATE = FRESH_THREAD + """
import os
import torch
os.environ["OMP_NUM_THREADS"] = "1"
print(f"omp={fresh_thread_omp()}", flush=True)
"""


def run(code: str) -> str:
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    env["PYTHONPATH"] = str(ROOT)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="one core: OpenMP's default is 1 thread, as asked")
def test_the_ranks_server_is_forked_with_the_ranks_openmp_thread_count():
    assert run(AT_THE_FORK) == "omp=1 torch_before=True"  # torch loaded (imported once), with the ranks' count
    assert run(TOO_LATE) == f"omp={os.cpu_count()}"  # what a rank forked without it would use


def rdv(source: str = "local", local: int = 2, rank: int = 0) -> SimpleNamespace:
    return SimpleNamespace(source=source, local_world_size=local, rank=rank)


def cfg(device: str = "auto", backend: str = "auto", threads: int = 0) -> SimpleNamespace:
    return SimpleNamespace(device=device, backend=backend, threads=threads)


def test_only_a_fronts_own_cpu_ranks_are_planned_to_fork_from_the_command(monkeypatch):
    monkeypatch.setattr(forks.os, "cpu_count", lambda: 8)
    monkeypatch.setattr(forks.glob, "glob", lambda pattern: [])  # no CUDA device file here
    assert forks.plan(cfg(), rdv()) == 4  # cores / local ranks
    assert forks.plan(cfg(threads=3), rdv()) == 3
    assert forks.plan(cfg(), rdv(local=1)) == 8  # one rank too: the command's torch is its
    assert forks.plan(cfg(), rdv("flags", 1)) == 8  # rank 0 beside a --rank 0 front: the front starts it
    assert forks.plan(cfg(), rdv("flags", 1, rank=1)) == 0 and forks.plan(cfg(), rdv("torchrun", 1)) == 0
    assert forks.plan(cfg(device="cuda"), rdv()) == 0 and forks.plan(cfg(backend="nccl"), rdv()) == 0
    monkeypatch.setattr(forks.glob, "glob", lambda pattern: ["/dev/nvidia0"])  # a GPU here: the usual start
    assert forks.plan(cfg(), rdv()) == 0 and forks.plan(cfg(device="cpu"), rdv()) == 0


def test_a_ranks_thread_count_is_the_flag_else_omp_num_threads_else_cores_over_ranks(monkeypatch):
    monkeypatch.setattr(devices.os, "cpu_count", lambda: 8)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert devices.thread_count(0, 2) == 4 and devices.thread_count(3, 2) == 3
    for text, count in [("3", 3), ("6,2", 6), (" 5 ", 5), ("0", 4), ("many", 4), ("", 4), ("99999", 4)]:
        monkeypatch.setenv("OMP_NUM_THREADS", text)  # torchrun's 1, a user's own; what OpenMP would not read: ours
        assert devices.thread_count(0, 2) == count, text
        assert devices.thread_count(2, 2) == 2  # --threads wins: the command sets it before torch loads


def test_a_rank_computes_with_openmps_count_where_torch_loaded_before_ddptop_could_set_it():
    """What a new thread's OpenMP starts with (libgomp's own answer, as gloo's threads get it) is the count
    OMP_NUM_THREADS gave when torch loaded; a rank that wanted another takes it, with one line saying why."""
    code = "from ddptop.train import devices; import torch; print(devices.openmp_default())"
    for omp in ("1", "3"):
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT,
                              env={**os.environ, "OMP_NUM_THREADS": omp, "PYTHONPATH": str(ROOT)})
        assert done.returncode == 0 and done.stdout.split() == [omp], done.stderr
    assert devices.agreed_threads(2, 2) == (2, "") and devices.agreed_threads(2, 0) == (2, "")
    threads, why = devices.agreed_threads(1, 3)
    assert threads == 3 and "OMP_NUM_THREADS=1" in why and "\n" not in why


def test_a_run_command_in_this_process_leaves_omp_num_threads_as_it_found_it(monkeypatch, capsys):
    """A run that fails after the command set the ranks' count (here: a --world-size that --local contradicts) left
    OMP_NUM_THREADS=2 in a test process once: every later job of that process then ran its ranks' main threads at 1
    and gloo's at 2, and the ranks' models came apart under PowerSGD (CI, tests/cli/test_ctl_settings.py)."""
    from ddptop import cli

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert cli.main(["--local", "1", "--world-size", "3", "--model", "tiny", "--headless"]) == 2
    assert "OMP_NUM_THREADS" not in os.environ
    monkeypatch.setenv("OMP_NUM_THREADS", "7")
    assert cli.main(["--local", "2", "--world-size", "3", "--threads", "1", "--model", "tiny", "--headless"]) == 2
    assert os.environ["OMP_NUM_THREADS"] == "7"
    assert capsys.readouterr().err.count("ranks but --world-size says 3") == 2  # refused where the test meant it


# A user's model that writes, from each process that builds it (the front checks it on a sample batch before any rank
# starts, then each rank builds its own), its name and its parent's, whether the cyclic collector runs there, how many
# objects it never visits (gc.freeze) and how many it still does.
GC_REPORTER = """
import gc, os
from torch import nn
def model():
    name = lambda pid: open(f"/proc/{{pid}}/comm").read().strip().replace(" ", "_")
    with open({report!r}, "a") as out:
        out.write(f"{{name(os.getpid())}} {{name(os.getppid())}} {{gc.isenabled()}} {{gc.get_freeze_count()}} "
                  f"{{len(gc.get_objects())}}\\n")
    return nn.Sequential(nn.Flatten(), nn.Linear(3 * 32 * 32, 10))
"""


@pytest.mark.parametrize("where", ["--local 1", "--local 2", "--rank 0"])
def test_a_fronts_cpu_ranks_fork_from_the_command_and_keep_its_imports_out_of_the_collectors_passes(tmp_path, where):
    """On a machine without a GPU every rank a front starts, one as well as several (--local N, and rank 0 beside a
    --rank 0 front), forks from the server the command forks out of itself once torch is loaded (a spawned rank
    imported torch again: ~5 CPU-s). torch and the rest a job imports (~330k objects) are frozen (gc.freeze) where
    they were imported, in the front and in that server, so no collection walks them again: each full pass over them
    took ~0.25 CPU-s, the one at the front's exit ~1 CPU-s. The collector itself stays on wherever the job runs."""
    own_server = not glob.glob("/dev/nvidia[0-9]*")  # a GPU here: the usual start (forks.plan), frozen all the same
    report = tmp_path / "gc.txt"
    (tmp_path / "mine.py").write_text(GC_REPORTER.format(report=str(report)))
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    env["PYTHONPATH"] = str(ROOT)
    flags = where.split()
    local = int(flags[1]) if flags[0] == "--local" else 1
    if flags[0] == "--rank":  # a job of one machine, its front's rank 0 alone
        flags += ["--world-size", "1", "--master", "127.0.0.1", "--port", str(ports.port())]
    done = subprocess.run([sys.executable, "-m", "ddptop", *flags, "--model", "mine.py:model", "--steps", "2",
                           "--batch-size", "8", "--synthetic-size", "64", "--no-eval", "--headless", "--no-record",
                           "--backend", "gloo"], capture_output=True, text=True, timeout=180, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    rows = [line.split() for line in report.read_text().splitlines()]
    ranks = sorted(row[0] for row in rows if row[0].startswith("ddptop-rank-"))
    assert ranks == [f"ddptop-rank-{r}" for r in range(local)], rows
    assert len(rows) == local + 1, rows  # and the front
    for name, parent, enabled, frozen, visited in rows:
        assert parent == "ddptop-forks" or not name.startswith("ddptop-rank-") or not own_server, rows
        assert enabled == "True", rows
        assert int(frozen) > int(visited), rows  # most of what the process holds is out of the collector's reach
