"""front/forks.py: when `ddptop` forks its CPU ranks' server out of itself, OpenMP in that server (and so in every rank
and every thread gloo starts in a rank) uses the ranks' thread count, which only an OMP_NUM_THREADS set before torch
loads gives. Read from libgomp itself in a fresh thread, as gloo's threads would read it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from ddptop.front import forks

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


def rdv(source: str = "local", local: int = 2) -> SimpleNamespace:
    return SimpleNamespace(source=source, local_world_size=local)


def cfg(device: str = "auto", backend: str = "auto", threads: int = 0) -> SimpleNamespace:
    return SimpleNamespace(device=device, backend=backend, threads=threads)


def test_only_several_local_cpu_ranks_are_planned_to_fork_from_the_command(monkeypatch):
    monkeypatch.setattr(forks.os, "cpu_count", lambda: 8)
    monkeypatch.setattr(forks.glob, "glob", lambda pattern: [])  # no CUDA device file here
    assert forks.plan(cfg(), rdv()) == 4  # cores / local ranks
    assert forks.plan(cfg(threads=3), rdv()) == 3
    assert forks.plan(cfg(), rdv(local=1)) == 0  # one rank: a fresh interpreter
    assert forks.plan(cfg(), rdv("flags", 1)) == 0 and forks.plan(cfg(), rdv("torchrun", 1)) == 0
    assert forks.plan(cfg(device="cuda"), rdv()) == 0 and forks.plan(cfg(backend="nccl"), rdv()) == 0
    monkeypatch.setattr(forks.glob, "glob", lambda pattern: ["/dev/nvidia0"])  # a GPU here: the usual start
    assert forks.plan(cfg(), rdv()) == 0 and forks.plan(cfg(device="cpu"), rdv()) == 0


def test_a_users_omp_num_threads_is_kept(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert not forks.set_threads(1) and os.environ["OMP_NUM_THREADS"] == "3"
    monkeypatch.delenv("OMP_NUM_THREADS")
    assert forks.set_threads(2) and os.environ["OMP_NUM_THREADS"] == "2"
    assert not forks.set_threads(0)
