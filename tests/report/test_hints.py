"""Hints (ddptop.metrics.hints) on recordings made to show each condition, and silent on segments that show none.

The committed lab recordings show the hot spot (NIC counters), one bucket and exposed communication, and segments
with none; one real 3-rank job with a slow data path (the test hook data-sleep-ms) shows data loading, one
bucket and the hot spot by the formulas. Every expected set comes from the recording itself, read with SQL (the
steps table, DDP's recorded buckets), or from the injected delay and the wire formulas, never from ddptop's
figures; `info` and the live screen say the same hints as the report.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from ddptop.cli import main
from ddptop.metrics import hints as rules
from ddptop.record.reader import Recording
from ddptop.report.hints import for_recording
from ddptop.state.session import SessionState
from ddptop.tui.render.overview import hint_line

RECORDINGS = Path(__file__).resolve().parents[2] / "recordings"
DATA_SLEEP_S, BATCH, RANKS = 0.015, 8, 3
PROFILE = f"""
[run]
model = "tiny"
batch_size = {BATCH}
synthetic_size = 960
span_every = 100
no_eval = true
[sweep]
warmup = 1
measure = 4
configs = [{{ strategy = "ddp", bucket_mb = 25 }}, {{ strategy = "gather-scatter" }}]
"""


def shown(path) -> dict[int, dict[str, rules.Hint]]:
    with Recording.open(str(path)) as rec:
        return {s.index: {h.name: h for h in found} for s, found in for_recording(rec)}


def sql_shares(path, segment: int, warmup: int) -> dict[str, float]:
    """A segment's exposed communication and data loading as shares of the mean step, straight from the steps
    table: every rank's steps after the warm-up, sampled steps (layer hooks) left out (each rank counts as many)."""
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    first = db.execute("SELECT step FROM segments WHERE segment = ?", (segment,)).fetchone()[0]
    step, exposed, data = db.execute(
        "SELECT avg(iter_s), avg(exposed_comm_s), avg(data_s) FROM steps WHERE segment = ? AND step >= ? "
        "AND sampled = 0", (segment, first + warmup)).fetchone()
    db.close()
    return {"exposed": exposed / step, "data": data / step}


def recorded_buckets(path) -> dict[str, list]:
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    value = json.loads(db.execute("SELECT value FROM meta WHERE key = 'ddp_buckets'").fetchone()[0])
    db.close()
    return value


def timed(path, segment: int, warmup: int) -> set[str]:
    """The hints whose rule is a share of the step, by the steps table."""
    shares = sql_shares(path, segment, warmup)
    return ({"exposed communication"} if shares["exposed"] >= rules.EXPOSED_SHARE else set()) | (
        {"data loading"} if shares["data"] >= rules.DATA_SHARE else set())


# (file, warm-up, {segment: the hints that do not depend on time}); the rest is `timed`
COMMITTED = [
    ("cs744-lab.db", 2, {0: set(), 1: {"hot spot"}, 2: set(), 3: set(), 4: set(), 5: {"hot spot"}, 6: set(),
                         7: set()}),
    ("cs744-lab-buckets.db", 2, {i: ({"one bucket"} if i in (3, 7) else set()) for i in range(8)}),
    ("live-switch.db", 1, {0: {"one bucket"}, 1: set(), 2: set(), 3: set()}),
]


@pytest.mark.parametrize("name,warmup,expected", COMMITTED, ids=[c[0] for c in COMMITTED])
def test_committed_recordings_show_exactly_their_conditions(name, warmup, expected):
    path = RECORDINGS / name
    found = shown(path)
    assert {i: set(h) for i, h in found.items()} == {i: e | timed(path, i, warmup) for i, e in expected.items()}
    buckets = recorded_buckets(path) if name != "cs744-lab.db" else {}
    for i, hints in found.items():
        if "one bucket" in hints:  # one recorded DDP bucket that holds the whole gradient
            assert len(buckets[str(i)]) == 1 and hints["one bucket"].numbers["gradient_bytes"] == buckets[str(i)][0][1]
        if "exposed communication" in hints:
            assert hints["exposed communication"].numbers["of_step"] == pytest.approx(
                sql_shares(path, i, warmup)["exposed"], rel=1e-9)
        if "hot spot" in hints:  # gather+scatter on 4 hosts: rank 0 moves (N−1)·S each way, the others S
            assert hints["hot spot"].source == "NIC counters per rank"
            assert hints["hot spot"].numbers["ratio"] == pytest.approx(3.0, rel=0.02)


def test_the_segments_that_show_none_are_silent():
    """DDP at 0.05 MB buckets (two buckets) on a quick loopback, and DDP at 25 MB on the lab: no hint at all."""
    assert not shown(RECORDINGS / "live-switch.db")[2] and not shown(RECORDINGS / "live-switch.db")[3]
    assert not shown(RECORDINGS / "cs744-lab.db")[3] and not shown(RECORDINGS / "cs744-lab.db")[7]


@pytest.fixture(scope="module")
def slow_data(tmp_path_factory):
    """3 local ranks, every training image 15 ms slower to load (120 ms a batch of 8): DDP at 25 MB (the tiny
    model's 84 KB gradient in one bucket), then gather+scatter."""
    folder = tmp_path_factory.mktemp("hints")
    (folder / "p.toml").write_text(PROFILE)
    record = folder / "slow.db"
    env = {**os.environ, "DDPTOP_TEST_MODEL": f"data-sleep-ms={DATA_SLEEP_S * 1e3:g}"}
    run = subprocess.run([sys.executable, "-m", "ddptop", "--headless", "--local", str(RANKS), "--profile",
                          str(folder / "p.toml"), "--record", str(record)], env=env, capture_output=True, text=True,
                         timeout=240)
    assert run.returncode == 0, run.stderr
    return record


def test_a_real_job_with_slow_data_shows_data_loading_one_bucket_and_the_hot_spot(slow_data):
    found = shown(slow_data)
    assert set(found[0]) == {"one bucket", "data loading"} | (timed(slow_data, 0, 1) - {"data loading"})
    assert set(found[1]) == {"hot spot"} | timed(slow_data, 1, 1)
    # data: at least the injected delay, the batch's images one after another (no loader workers on CPU)
    assert found[0]["data loading"].numbers["data_s"] >= BATCH * DATA_SLEEP_S
    assert found[0]["one bucket"].numbers["gradient_bytes"] == recorded_buckets(slow_data)["0"][0][1]
    # 3 ranks, per-rank loopback shared: the formulas, (N−1)·S each way at rank 0 against S at the others
    assert found[1]["hot spot"].numbers["ratio"] == pytest.approx(RANKS - 1)
    assert "formulas" in found[1]["hot spot"].source


def test_info_and_the_live_screen_say_the_same_hints(slow_data, capsys):
    assert main(["info", str(slow_data)]) == 0
    text = capsys.readouterr().out
    expected = [f"  segment {i}: {h.line()}" for i, hs in shown(slow_data).items() for h in hs.values()]
    assert text.split("\nhints\n", 1)[1].splitlines()[:len(expected)] == expected
    assert main(["info", "--json", str(slow_data)]) == 0
    listed = json.loads(capsys.readouterr().out)["hints"]
    assert [(h["segment"], h["name"]) for h in listed] == [(i, n) for i, hs in shown(slow_data).items() for n in hs]
    state = SessionState()
    with Recording.open(str(slow_data)) as rec:
        state.apply_all(rec.events())
    snap = state.snapshot()  # the segment in force: gather+scatter, the last
    assert [h.name for h in snap.hints] == list(shown(slow_data)[1])
    line = hint_line(snap, 400).plain
    assert line.startswith("hints  ") and snap.hints[0].text in line
