"""A recording process killed with SIGKILL at any moment leaves a file that opens with all but the last second."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from ddptop.cli import main
from ddptop.errors import RecordingError
from ddptop.record.reader import Recording

FEEDER = """
import sys, time
from ddptop.events import StepDone
from ddptop.record.sqlite import RecordingWriter, base_meta
writer = RecordingWriter(sys.argv[1], base_meta({"model": "tiny"}, {"world_size": 1}))
print("ready", flush=True)
step = 0
while True:  # a step every 5 ms, handed over one by one as fast as a collector would
    writer.handle([StepDone(0, step, 0, 0, time.time(), 0.005, 0, 0, 0, 0, 0, 1, 1.0, 0, 0, 0, False)])
    step += 1
    time.sleep(0.005)
"""


@pytest.mark.parametrize("run_for", [0.3, 0.8, 2.4])
def test_a_writer_killed_mid_stream_keeps_all_but_the_last_second(tmp_path, run_for, capsys):
    path = str(tmp_path / "killed.db")
    proc = subprocess.Popen([sys.executable, "-c", FEEDER, path], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        ready_at = time.time()
        time.sleep(run_for)
        killed_at = time.time()
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    with Recording.open(path) as rec:
        steps = list(rec.step_events())
        assert not rec.complete
    assert [d.step for d in steps] == list(range(len(steps)))  # nothing missing in between
    newest = steps[-1].t if steps else ready_at  # killed within its first second: nothing may be older than 1 s
    assert newest >= killed_at - 1.0, f"newest step {killed_at - newest:.2f} s before the kill"
    assert steps or run_for < 0.5
    assert main(["info", path]) == 0
    assert "incomplete" in capsys.readouterr().out


def _steps_so_far(path: str) -> int:
    try:
        with Recording.open(path) as rec:
            return rec.count("steps")
    except RecordingError:  # not created yet, or the schema is still being written
        return 0


def test_a_real_job_killed_with_sigkill_leaves_a_readable_recording(tmp_path, capsys):
    """The whole job (front process and both ranks) dies at once, mid-run."""
    path = str(tmp_path / "job.db")
    argv = [sys.executable, "-m", "ddptop", "--headless", "--local", "2", "--model", "tiny", "--steps", "2000",
            "--synthetic-size", "640", "--batch-size", "16", "--no-eval", "--backend", "gloo", "--record", path]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 90
        while _steps_so_far(path) < 40 and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.2)
        assert proc.poll() is None, "the job ended before it could be killed"
        killed_at = time.time()
        os.killpg(proc.pid, signal.SIGKILL)  # the session we started: the front and its rank processes
    finally:
        proc.wait(timeout=30)
    with Recording.open(path) as rec:
        assert not rec.complete and rec.meta["model"]["model"] == "tiny" and rec.meta["hosts"]
        for rank in (0, 1):
            steps = [d for d in rec.step_events() if d.rank == rank]
            assert [d.step for d in steps] == list(range(len(steps))) and len(steps) >= 15
        newest = max(d.t for d in rec.step_events())
    # ranks hand events over every 0.25 s and the front polls every 0.2 s, before the recorder's ≤0.5 s commit
    assert newest >= killed_at - 2.0
    for argv in (["info", path], ["export", path, "--csv", str(tmp_path / "csv")], ["replay", path, "--headless", "--instant"]):
        assert main(argv) == 0, capsys.readouterr().err
