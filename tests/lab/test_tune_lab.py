"""`--tune bucket` on a lab (issue 23: "lands within 5% of the best measured bucket size in at most 5 trial segments"):
3 hosts of 0.67 core at 1 Gbit/s, VGG-11 at batch 8 per host (the what-if grid's job, where 1-50 MB buckets differ by
up to 15%), DDP from 25 MB. Once the tune has said what it kept, this test sets each size of 1, 5, 10, 25 and 50 MB
that the tune did not try, in the same job, as a user would (`ddptop lab exec ddptop ctl set bucket_mb=…`). SQL on the
recording then measures every size: the kept one is within 5% of the fastest. Sizes are compared within one job:
two jobs on this machine measured one size 13% apart (README, What-if), more than the sizes differ."""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import subprocess
import sys

import pytest

from ddptop.lab import state
from labs import LAB_REFUSED, REPO, LabProcess, inodes, leftovers

pytestmark = pytest.mark.skipif(bool(LAB_REFUSED), reason=LAB_REFUSED or "labs work")
SIZES = (1, 5, 10, 25, 50)
WARMUP, MEASURE = 2, 12  # steps of an untried size's segment: left out, then measured
ARGS = ["--nodes", "3", "--link", "1gbit", "--headless", "--model", "vgg11", "--batch-size", "8", "--synthetic-size",
        "2400", "--no-eval", "--seed", "1", "--strategy", "ddp", "--bucket-mb", "25", "--tune", "bucket",
        "--steps", "100000", "--log-every", "1"]


def slowest_mean(con: sqlite3.Connection, segment: int, first: int, last: int) -> float:
    """The slowest rank's mean step time over steps first..last of a segment (sampled steps left out)."""
    rows = con.execute("""SELECT rank, avg(iter_s) FROM steps WHERE segment = ? AND step BETWEEN ? AND ?
                          AND sampled = 0 GROUP BY rank""", (segment, first, last)).fetchall()
    assert len(rows) == 3, (segment, rows)
    return max(mean for _, mean in rows)


def last_step(lab: LabProcess) -> int:
    return max(int(m.group(1)) for line in lab.lines if (m := re.match(r"^step (\d+)/", line)))


def test_the_tune_keeps_a_size_within_5_percent_of_the_fastest_measured_in_the_same_job(tmp_path):
    db = tmp_path / "tune.db"
    lab = LabProcess([*ARGS, "--record", str(db)], tmp_path)
    record = lab.record()
    held = inodes(record)
    env = {**os.environ, "PYTHONPATH": str(REPO), state.STATE_ENV: str(tmp_path)}
    try:
        said = lab.wait_line(r"^tune bucket: ", timeout=400)
        assert said.startswith("tune bucket: kept "), lab.output
        tried = {float(x) for x in re.findall(r"(\d+(?:\.\d+)?) MB", said)}  # the start, the trials, the kept size
        for size in sorted(set(SIZES) - tried):
            done = subprocess.run([sys.executable, "-m", "ddptop", "lab", "exec", "ddptop", "ctl", "set",
                                   f"bucket_mb={size}"], capture_output=True, text=True, timeout=120, env=env)
            assert done.returncode == 0, (done.stdout, done.stderr)
            until = last_step(lab) + WARMUP + MEASURE + 1
            lab.wait_line(rf"^step {until}/", timeout=120)
    finally:
        lab.proc.send_signal(signal.SIGINT)
        assert lab.wait(120) == 0, lab.output
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as con:
        note = json.loads(con.execute("SELECT data FROM events WHERE kind = 'tune_note'").fetchone()[0])
        assert 1 <= len(note["trials"]) <= 5 and note["reason"] == "", note
        measured = {}
        for trial in [note["start"], *note["trials"]]:  # the tune's own windows
            measured.setdefault(trial["bucket_mb"], slowest_mean(con, trial["segment"], trial["first_step"],
                                                                 trial["last_step"]))
        for segment, config in con.execute("SELECT segment, config FROM segments ORDER BY segment"):
            size = json.loads(config)["bucket_mb"]
            if size in measured:
                continue
            first = con.execute("SELECT min(step) FROM steps WHERE segment = ?", (segment,)).fetchone()[0] + WARMUP
            measured[size] = slowest_mean(con, segment, first, first + MEASURE - 1)
    print({k: round(v, 4) for k, v in sorted(measured.items())}, "s/step; kept", note["kept_mb"])
    assert set(SIZES) <= set(measured), measured
    best = min(measured.values())
    assert measured[note["kept_mb"]] <= 1.05 * best, (note["kept_mb"], measured)
    assert leftovers(record, held, tmp_path) == []
