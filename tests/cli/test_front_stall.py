"""Issue 41's "done when": the front stopped (SIGSTOP) for twice --timeout, continued, then a rank killed: every step
before the kill is in the recording, the lost rank is reported within --lost-after, and `info` says what happened.

Before issue 41 a front that stalled longer than --timeout stopped receiving steps for good, silently (the channel
client's late reply was taken for the next call's answer), and a rank that died afterwards was never reported lost.
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from ddptop.control.client import ControlClient
from ddptop.control.token import running_jobs
from ddptop.events import RankLost, StepDone, TelemetryGap
from ddptop.record.reader import Recording
from test_faults import finish, no_traceback, start, wait_training
from test_run_cli import TINY, ddptop

TIMEOUT_S = 5
LOST_AFTER_S = 6


@pytest.fixture(autouse=True)
def own_job_files(tmp_path, monkeypatch):
    monkeypatch.setenv("DDPTOP_STATE_DIR", str(tmp_path / "jobs"))  # children inherit it through os.environ


def step_of(port: int) -> int:
    return ControlClient.find(None, port, None).status()["step"]


@pytest.mark.alone
def test_a_front_stopped_for_twice_the_timeout_misses_no_step_and_still_reports_a_lost_rank(tmp_path):
    record = tmp_path / "stall.db"
    front = start("--local", "2", "--record", str(record), "--timeout", str(TIMEOUT_S),
                  "--lost-after", str(LOST_AFTER_S), "--steps", "100000", "--log-every", "1000", *TINY)
    ranks = wait_training(front, 2)
    port = running_jobs()[0]["port"]
    os.kill(front.pid, signal.SIGSTOP)  # the front alone: its ranks train on, their telemetry waits for it
    time.sleep(2 * TIMEOUT_S)
    os.kill(front.pid, signal.SIGCONT)
    before = step_of(port)
    deadline = time.monotonic() + 30
    while step_of(port) < before + 5 and time.monotonic() < deadline:  # it trains on after the stall
        time.sleep(0.2)
    time.sleep(1)
    killed_at = time.time()
    ranks[1].kill()
    out, err, took = finish(front)
    assert front.returncode == 5, err
    no_traceback(out, err)
    with Recording.open(str(record)) as rec:
        events = list(rec.events())
    assert not [e for e in events if isinstance(e, TelemetryGap)], "no batch was lost to the stall"
    for rank in (0, 1):  # every step each rank finished, once and in order: those made while the front was stopped
        steps = [e.step for e in events if isinstance(e, StepDone) and e.rank == rank]
        assert steps == list(range(len(steps))) and len(steps) > before, (rank, steps[-5:], before)
    last = max(e.t for e in events if isinstance(e, StepDone) and e.rank == 1)
    assert killed_at - last < 1.0  # what it queued since its last send (every 0.25 s) and the step it was in
    lost = [e for e in events if isinstance(e, RankLost)]
    killed = [e for e in lost if e.rank == 1]  # rank 0 may be reported too: it exits 5 once its peer is gone
    assert killed and killed[0].t - killed_at < LOST_AFTER_S, lost
    assert not [e for e in lost if e.t < killed_at], "nobody was lost while the front was stopped"
    info = ddptop("info", str(record))
    assert info.returncode == 0 and "rank 1 lost after step" in info.stdout and "incomplete: " in info.stdout
