"""The What-if panel (8) over a replay of the committed recordings/whatif-lab.db (8 configurations on 3 lab hosts),
played to its end the way a user watches it: the table equals `ddptop advise --segment N --json` (a separate
command reading the file) on the segment in force, and every switch's measured step time equals SQL on the steps
table, its prediction what advise predicts for it from the segment before."""

from __future__ import annotations

import contextlib
import functools
import io
import json
import re
import sqlite3
import statistics
from pathlib import Path

import pytest

from ddptop import cli
from ddptop.front.pipeline import compose
from ddptop.record.replay import ReplaySource
from ddptop.tui.app import DdptopApp
from in_process import slowest_rank_means
from screen_text import screen_text

REC = Path(__file__).resolve().parents[2] / "recordings" / "whatif-lab.db"
WARMUP = 1  # the recording's own (`ddptop info` says "each segment's first 1 step left out")


@functools.lru_cache(maxsize=None)
def advise(segment: int) -> dict:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli.main(["advise", str(REC), "--segment", str(segment), "--json"]) == 0
    return json.loads(out.getvalue())


def measured() -> dict[int, float]:
    """Each segment's slowest rank's mean step time, warm-up and sampled steps left out (SQL, not ddptop)."""
    return slowest_rank_means(REC, WARMUP)


def configs() -> dict[int, tuple]:
    """Each segment's (strategy, bucket_mb or None, async_op) from the segments table (SQL)."""
    with sqlite3.connect(REC) as con:
        rows = con.execute("SELECT segment, config FROM segments").fetchall()
    out = {}
    for index, text in rows:
        c = json.loads(text)
        out[index] = (c["strategy"], float(c.get("bucket_mb", 25.0)) if c["strategy"] == "ddp" else None,
                      bool(c.get("async_op")) and c["strategy"] == "allreduce")
    return out


def ranked_best(rows: list[dict]) -> tuple[dict, float]:
    """The fastest row, each ranked by its segment's measured step time (SQL) where the recording ran it, else its
    prediction (issue 44: a measured configuration is ranked by its measurement), and its saving in ms against
    segment 7's measured step. Segment 7 (gather-scatter) is far slower than every other: the saving is clear."""
    truth = measured()

    def ranked(r: dict) -> float:
        return r["step_s"] if r["segment"] is None else truth[r["segment"]]

    best = min(rows, key=ranked)
    return best, (truth[7] - ranked(best)) * 1e3


@pytest.fixture(scope="module")
def played():
    """The replay played at 16× to its end with the What-if panel shown (then at 80×24), and the overview."""
    import asyncio

    async def play():
        source = ReplaySource(str(REC), speed=16.0, playing=True)
        app = DdptopApp(compose(source))
        try:
            async with app.run_test(size=(160, 48)) as pilot:
                await pilot.press("8")
                for _ in range(120):  # 61 s of recording at 16×: about 4 s
                    await pilot.pause(0.25)
                    if app.state.snapshot().finished and app.state.snapshot().step >= 55:
                        break
                await pilot.pause(0.6)  # the panel redraws at most every 0.5 s
                wide = screen_text(app)
                snap = app.state.snapshot()
                await pilot.resize_terminal(80, 24)
                await pilot.pause(0.6)
                narrow = screen_text(app)
                await pilot.press("1")
                await pilot.pause(0.3)
                return snap, wide, narrow, screen_text(app)
        finally:
            source.close()

    return asyncio.run(play())


def test_the_table_is_advises_on_the_segment_in_force(played):
    snap, wide, narrow, _ = played
    w = snap.whatif
    assert w.seg is not None and w.seg.segment == snap.segment == 7
    expected = advise(7)["predictions"]
    assert len(w.rows) == len(expected)
    for got, want in zip(w.rows, expected):
        assert {k: got[k] for k in ("strategy", "bucket_mb", "async_op", "world_size", "segment")} == \
            {k: want[k] for k in ("strategy", "bucket_mb", "async_op", "world_size", "segment")}
        for key in ("step_s", "exposed_comm_s", "overlap", "measured_step_s"):
            assert got[key] == pytest.approx(want[key], abs=2e-6), key  # advise rounds to 1 µs
        assert got["held_bytes"] == want["held_bytes"]
    best, saving_ms = ranked_best(expected)
    words = best["strategy"] + (f" {best['bucket_mb']:g} MB" if best["bucket_mb"] is not None else "")
    assert f"best: {words}, −{saving_ms:.0f} ms/step" in wide, wide
    for line in (line for line in wide.splitlines() if line.strip().startswith(("ddp ", "allreduce "))):
        assert " 1/none " in line, line  # every row says its accum and compression (issue 44)
    assert "fitted from segment 7 (gather-scatter, 3 ranks)" in wide
    for text in (wide, narrow):  # every configuration's row, at both sizes
        assert text.count(" ddp ") >= 6 and "gather-scatter" in text
    # the wide table's memory per rank: each ZeRO stage's by its formula, as advise --json has it
    for stage in ("zero1", "zero2", "zero3"):
        held = next(r["held_bytes"] for r in expected if r["strategy"] == stage and r["world_size"] == 3)
        line = next(x for x in wide.splitlines() if x.strip().startswith(stage))
        assert f"{held / 1e6:.2f}" in line.split(), line


def test_each_switch_shows_its_prediction_its_measurement_and_the_running_error(played):
    snap, wide, _, _ = played
    truth, ran = measured(), configs()
    checks = snap.whatif.checks
    assert [c.segment for c in checks] == list(range(1, 8))
    errors = []
    for c in checks:
        assert c.from_segment == c.segment - 1
        assert c.measured_s == pytest.approx(truth[c.segment], rel=1e-9)
        strategy, bucket, is_async = ran[c.segment]
        row = next(r for r in advise(c.from_segment)["predictions"]
                   if (r["strategy"], r["bucket_mb"], r["async_op"]) == (strategy, bucket, is_async))
        assert c.predicted_s == pytest.approx(row["step_s"], abs=2e-6)
        errors.append(abs(row["step_s"] - truth[c.segment]) / truth[c.segment])
        shown = f"#{c.segment} "
        line = next(line for line in wide.splitlines() if line.strip().startswith(shown))
        assert f"error {(row['step_s'] - truth[c.segment]) / truth[c.segment]:+.1%}" in line, line
    median, most = snap.whatif.running
    assert median == pytest.approx(statistics.median(errors)) and most == pytest.approx(max(errors))
    assert f"running error median {statistics.median(errors):.1%}, max {max(errors):.1%} over 7 switches" in wide


def test_the_overview_names_the_best_configuration_on_one_line(played):
    snap, wide, _, overview = played
    best, saving_ms = ranked_best(advise(7)["predictions"])
    line = next(line for line in overview.splitlines() if line.strip().startswith("hints"))
    assert f"what-if from #7: {best['strategy']} {best['bucket_mb']:g} MB, −{saving_ms:.0f} ms/step" in line, overview
    assert "8 What-if" in wide.splitlines()[3] and "1-8 Panels" in overview.splitlines()[-1]
