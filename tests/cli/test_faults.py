"""Failures a multi-node job meets: a worker or the master killed, Ctrl-C/SIGTERM, and refused joins."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from ddptop.control.client import ControlClient
from ddptop.control.store import free_port
from ddptop.control.token import running_jobs
from ddptop.errors import DdptopError
from test_run_cli import DDPTOP, TINY, ddptop

BOUND_S = 90  # every surviving process must be gone this long after a fault
LONG = ["--steps", "100000", "--log-every", "1000", *TINY]


def start(*args: str, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen(DDPTOP + list(args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **(env or {})}, start_new_session=True)


@pytest.fixture(autouse=True)
def own_job_files(tmp_path, monkeypatch):
    monkeypatch.setenv("DDPTOP_STATE_DIR", str(tmp_path / "jobs"))  # children inherit it through os.environ


def wait_training(proc: subprocess.Popen, ranks: int, timeout: float = 60) -> list[psutil.Process]:
    """The rank processes of a front once its job has done a few steps (read through the control plane)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            jobs = running_jobs()
            if jobs and ControlClient.find(None, jobs[0]["port"], None).status()["step"] >= 3:
                return [c for c in psutil.Process(proc.pid).children() if "spawn_main" in " ".join(c.cmdline())]
        except DdptopError:
            pass
        time.sleep(0.3)
    raise AssertionError("ranks never started training")


def finish(proc: subprocess.Popen, timeout: float = BOUND_S) -> tuple[str, str, float]:
    start_t = time.monotonic()
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    return out, err, time.monotonic() - start_t


def no_traceback(*texts: str) -> None:
    for text in texts:
        assert "Traceback" not in text, text


def test_a_killed_worker_is_reported_and_the_job_ends(tmp_path):
    record = tmp_path / "fault.db"
    front = start("--local", "2", "--record", str(record), *LONG)
    ranks = wait_training(front, 2)
    ranks[1].kill()
    out, err, took = finish(front)
    assert took < BOUND_S and front.returncode == 5, err
    assert "rank 1 lost after step" in out and "killed by signal 9" in out
    assert err.strip().splitlines()[-1].startswith("ddptop: the job failed: rank 1 process")
    no_traceback(out, err)
    assert not ranks[0].is_running() or ranks[0].status() == psutil.STATUS_ZOMBIE
    # the recording holds every step each rank finished before the fault, and the fault itself
    from ddptop.events import RankLost, StepDone
    from ddptop.record.reader import Recording

    with Recording.open(str(record)) as rec:
        events = list(rec.events())
    for rank in (0, 1):
        steps = [e.step for e in events if isinstance(e, StepDone) and e.rank == rank]
        assert len(steps) >= 3 and steps == list(range(len(steps)))
    lost = [e for e in events if isinstance(e, RankLost)]
    assert any(e.rank == 1 and "signal 9" in e.reason for e in lost)


def _two_nodes(port: str, *extra: str, env1: dict | None = None):
    common = ["--master", "127.0.0.1", "--port", port, "--world-size", "2", "--timeout", "30", *LONG]
    master = start("--rank", "0", *common, *extra)
    worker = start("--rank", "1", *common, *extra, env=env1)
    return master, worker


def test_a_killed_master_stops_the_workers():
    master, worker = _two_nodes(str(free_port()))
    wait_training(master, 1)
    os.kill(master.pid, signal.SIGKILL)  # its rank-0 process dies with it (PR_SET_PDEATHSIG)
    out, err, took = finish(worker)
    assert took < BOUND_S and worker.returncode != 0
    last = err.strip().splitlines()[-1]
    assert last.startswith("ddptop: ") and ("lost contact" in last or "lost the job's master" in last), err
    no_traceback(out, err)
    master.communicate(timeout=10)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_stopping_the_master_stops_every_rank_and_frees_the_port(sig):
    port = str(free_port())
    master, worker = _two_nodes(port)
    kids = wait_training(master, 1)
    os.kill(master.pid, sig)
    out, err, took = finish(master)
    w_out, w_err, _ = finish(worker)
    assert master.returncode == 0 and worker.returncode == 0, err + w_err
    assert "(stopped)" in out and "finished" in w_err
    no_traceback(out, err, w_out, w_err)
    assert not any(k.is_running() and k.status() != psutil.STATUS_ZOMBIE for k in kids)
    again = ddptop("--local", "2", "--port", port, "--steps", "2", *TINY)  # the port is free for the next run
    assert again.returncode == 0, again.stderr


def test_a_wrong_token_never_reaches_the_job_and_both_sides_give_up_in_one_line():
    """With a token the handshake runs in the job's secret namespace: a rank with another token never sees it
    (so a stranger cannot abort a job by answering for it) and both sides give up after --timeout."""
    port = str(free_port())
    master = start("--rank", "0", "--master", "127.0.0.1", "--port", port, "--world-size", "2", "--token",
                   "right-token-1", "--timeout", "8", *LONG)
    worker = ddptop("--rank", "1", "--master", "127.0.0.1", "--port", port, "--world-size", "2", "--token",
                    "wrong-token-2", "--timeout", "8", *LONG)
    out, err, _ = finish(master)
    assert worker.returncode == 4 and "with the same --token" in worker.stderr.strip().splitlines()[-1]
    assert master.returncode == 4 and "rank(s) 1 did not join within 8 s" in err and "same --token" in err
    no_traceback(worker.stderr, err)


def test_another_ddptop_version_is_refused_at_the_handshake(tmp_path):
    fake = tmp_path / "ddptop"
    shutil.copytree(Path(__file__).resolve().parents[2] / "ddptop", fake)
    init = fake / "__init__.py"
    init.write_text(init.read_text().replace('__version__ = "', '__version__ = "9.9-'))
    port = str(free_port())
    master = start("--rank", "0", "--master", "127.0.0.1", "--port", port, "--world-size", "2", "--timeout", "30",
                   *LONG)
    worker = ddptop("--rank", "1", "--master", "127.0.0.1", "--port", port, "--world-size", "2", "--timeout", "30",
                    *LONG, env={"PYTHONPATH": str(tmp_path)}, cwd=tmp_path)  # `-m` would find ./ddptop first
    out, err, _ = finish(master)
    assert worker.returncode == 4 and "ddptop version 9.9-" in worker.stderr, worker.stderr
    assert master.returncode != 0 and "ddptop version 9.9-" in err
    no_traceback(worker.stderr, err)
