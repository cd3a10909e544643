"""A recording process killed with SIGKILL at any moment leaves a file that opens with every batch it committed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from calibrate import slowdown

from ddptop.cli import main
from ddptop.errors import RecordingError
from ddptop.record.reader import Recording

COMMIT_S = 0.5  # RecordingWriter's default commit_every_s, named here so the feeder and the bounds agree
FEEDER = f"""
import sys, time
from ddptop.events import StepDone
from ddptop.record.sqlite import RecordingWriter, base_meta
writer = RecordingWriter(sys.argv[1], base_meta({{"model": "tiny"}}, {{"world_size": 1}}), commit_every_s={COMMIT_S})
print("ready", flush=True)
step = 0
while True:  # a step every 5 ms, handed over one by one as fast as a collector would; then what is committed so far
    writer.handle([StepDone(0, step, 0, 0, time.time(), 0.005, 0, 0, 0, 0, 0, 1, 1.0, 0, 0, 0, False)])
    print(step, writer.written, time.monotonic(), flush=True)
    step += 1
    time.sleep(0.005)
"""


@pytest.mark.parametrize("run_for", [0.3, 0.8, 2.4])
def test_a_writer_killed_mid_stream_keeps_every_committed_batch(tmp_path, run_for, capsys):
    """Counted in rows, not seconds: the feeder prints each step it handed over and how many steps the writer had
    committed (`written`) by then. After SIGKILL the file holds at least every committed step, nothing missing in
    between, and loses at most what was not committed yet: the batch being written and the one gathering, each at
    most the largest batch this run committed (a row of slack: the step handed after the last line). A feeder that
    ran for more than two commit intervals by its own clock saw a commit."""
    path = str(tmp_path / "killed.db")
    proc = subprocess.Popen([sys.executable, "-c", FEEDER, path], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        time.sleep(run_for)
        proc.send_signal(signal.SIGKILL)
        printed = proc.stdout.read()  # every line written before the kill is still in the pipe
    finally:
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    fields = [line.split() for line in printed.splitlines() if line.count(" ") == 2]
    lines = [(int(step), int(written), float(at)) for step, written, at in fields]
    assert lines, printed[-500:]
    handed, committed = lines[-1][0] + 1, lines[-1][1]
    seen = sorted({written for _, written, _ in lines} | {0})
    batches = [b - a for a, b in zip(seen, seen[1:])]
    with Recording.open(path) as rec:
        steps = list(rec.step_events())
        assert not rec.complete
    kept = len(steps)
    assert [d.step for d in steps] == list(range(kept))  # nothing missing in between
    assert committed <= kept <= handed + 1, (committed, kept, handed)  # every committed step survived the kill
    if lines[-1][2] - lines[0][2] > 2 * COMMIT_S:
        assert batches, f"no commit in {lines[-1][2] - lines[0][2]:.2f} s of feeding"
    if batches:
        assert handed - kept <= 2 * max(batches) + 1, (handed, kept, batches)
    with capsys.disabled():
        print(f"ran {run_for} s: handed {handed}, committed {committed} when last seen, kept {kept}, batches {batches}")
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
        factor = slowdown()  # just before the kill: what this machine does to the 2 s below (calibrate.py)
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
    assert newest >= killed_at - 2.0 * factor, (killed_at - newest, factor)
    for argv in (["info", path], ["export", path, "--csv", str(tmp_path / "csv")], ["replay", path, "--headless", "--instant"]):
        assert main(argv) == 0, capsys.readouterr().err
