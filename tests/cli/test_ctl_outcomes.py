"""How a `ddptop ctl set` that waits ends when a rank of the job is killed under it: exit 5 and one line, against a
real 2-rank job. (The job stopped under it instead, by `ctl stop`: exit 1, `the job ended (…) while request N
waited`; checked by hand, not here, to keep the suite's time: each case starts a job.)"""

from __future__ import annotations

import os
import signal
import subprocess
import time

import psutil

from procs import rank_processes
from test_run_cli import DDPTOP, TINY

LONG = ["--local", "2", "--steps", "100000", "--log-every", "1000", *TINY]


def ctl(*args: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(DDPTOP + ["ctl", *args], capture_output=True, text=True, timeout=60, env=env)


def paused_job_with_a_waiting_set(env: dict) -> tuple[subprocess.Popen, subprocess.Popen, list[psutil.Process]]:
    """A job paused by `ctl pause`, and a `ctl set lr=0.05` that waits for the resume (rank 0 accepted it)."""
    job = subprocess.Popen(DDPTOP + LONG, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                           start_new_session=True)
    deadline = time.monotonic() + 60
    while ctl("pause", env=env).returncode != 0:
        assert time.monotonic() < deadline and job.poll() is None, job.stderr.read() if job.poll() is not None else ""
        time.sleep(0.5)
    while '"paused": true' not in ctl("status", "--json", env=env).stdout:
        assert time.monotonic() < deadline
        time.sleep(0.2)
    waiting = subprocess.Popen(DDPTOP + ["ctl", "set", "lr=0.05"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, env=env)
    time.sleep(2)  # rank 0 reads requests every 50 ms: accepted, and it waits for the resume
    assert waiting.poll() is None, waiting.communicate()
    ranks = rank_processes(job.pid)
    assert len(ranks) == 2
    return job, waiting, ranks


def test_a_set_waiting_when_a_rank_is_killed_exits_5_in_one_line(tmp_path):
    env = {**os.environ, "DDPTOP_STATE_DIR": str(tmp_path / "jobs")}
    job, waiting, ranks = paused_job_with_a_waiting_set(env)
    try:
        killed = sorted(ranks, key=lambda r: r.pid)[1]  # started second: rank 1
        killed.send_signal(signal.SIGKILL)
        out, err = waiting.communicate(timeout=60)
        job.communicate(timeout=90)
    finally:
        for proc in (waiting, job):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL) if proc is job else proc.kill()
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert waiting.returncode == 5 and job.returncode == 5, err
    assert lines[0].startswith(f"ddptop: a rank was lost while the request waited: rank 1 process {killed.pid} "
                               "killed by signal 9"), lines[0]
