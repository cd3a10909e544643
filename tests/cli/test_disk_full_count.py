"""After the recording's disk fills mid-run, the closing line says what the FILE holds, not what the run trained.

A real 2-rank job records to a 2 MB tmpfs of its own (as README's Failures table and test_faults do) and the disk
is filled while it trains; the job goes on to its last step. The printed `recorded N steps of 2 ranks` must equal
a count made with sqlite3 on the file. Before the fix it printed the run's step count (40) for a file holding a
handful.
"""

from __future__ import annotations

import os
import re
import sqlite3
import subprocess
import sys
import time

import pytest

STEPS = 40


def fill(folder) -> None:
    with open(folder / "filler", "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 65536)
        except OSError:  # ENOSPC: the disk is full
            pass


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")
def test_the_closing_line_counts_the_steps_the_file_holds(small_disk):
    record = small_disk / "run.db"
    job = subprocess.Popen([sys.executable, "-m", "ddptop", "--headless", "--local", "2", "--model", "tiny",
                            "--synthetic-size", "1280", "--batch-size", "16", "--no-eval", "--backend", "gloo",
                            "--steps", str(STEPS), "--log-every", "1", "--record", str(record)],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           env={**os.environ, "DDPTOP_TEST_MODEL": "sleep-ms=100"})
    try:
        printed = []
        for line in job.stdout:
            printed.append(line)
            if line.startswith("step 4/"):  # a few commits (one every 0.5 s) with steps in them
                break
        fill(small_disk)
        out, err = job.communicate(timeout=180)
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()
    out = "".join(printed) + out
    assert job.returncode == 0, err
    assert f"finished: {STEPS} steps on 2 ranks" in out and "stopped: database or disk is full" in out + err
    (small_disk / "filler").unlink()
    with sqlite3.connect(f"file:{record}?mode=ro", uri=True) as db:
        held, ranks = db.execute("SELECT count(DISTINCT step), count(DISTINCT rank) FROM steps").fetchone()
    db.close()
    assert held < STEPS  # the disk filled mid-run: the file lacks the later steps
    if held == 0:  # filled before the first commit that held a step
        assert f"recorded no training steps to {record} (the run trained {STEPS})\n" in out, out
        return
    said = re.search(r"^recorded (\d+) steps? of (\d+) ranks? to (\S+)(.*)$", out, re.M)
    assert said, out
    assert (int(said.group(1)), int(said.group(2)), said.group(3)) == (held, ranks, str(record)), out
    assert said.group(4) == f" (the run trained {STEPS}: the file stops early)"


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")
def test_a_run_whose_ranks_joined_keeps_its_file_when_the_disk_filled_before_any_write(small_disk):
    """A failed start leaves no file; a run whose ranks joined keeps one, even when the disk was full before the
    first commit: it holds what was written at its opening and reads incomplete, and the closing line says it
    holds no step. (With ranks quick to start, the first commit can come after the disk filled.)"""
    from ddptop.events import RankJoined
    from ddptop.record.sqlite import RecordingWriter

    record = small_disk / "run.db"
    writer = RecordingWriter(str(record), {"config": {}}, commit_every_s=0.2, on_error=lambda reason: None)
    fill(small_disk)
    writer.handle([RankJoined(r, 2, "h", 1, "cpu", "gloo", 1, "2", "0.1.0", "local", time.time()) for r in (0, 1)])
    writer.discard()
    assert writer.error and "full" in writer.error
    (small_disk / "filler").unlink()
    assert record.exists()
    with sqlite3.connect(f"file:{record}?mode=ro", uri=True) as db:
        assert db.execute("SELECT count(*) FROM steps").fetchone() == (0,)
    db.close()
