"""One recording, every consumer, the same segment figures: `info --json`, `export --csv`, `report` and the state a
replayed screen draws from all give each segment's numbers as ddptop.metrics defines them."""

from __future__ import annotations

import csv
import json
import math
import subprocess
import sys
import time

import pytest

from ddptop.front.pipeline import compose
from ddptop import metrics
from ddptop.cli import main
from ddptop.record.replay import ReplaySource
from ddptop.state.session import SessionState
from test_report import table_rows

KEYS = ("step_s_slowest", "median_step_s_slowest", "step_s_mean", "images_per_s", "compute_s", "comm_s",
        "exposed_comm_s", "overlap", "ddptop_s", "other_s", "sent_mb", "final_loss", "measured_steps")


@pytest.fixture(scope="module")
def figures(smoke, tmp_path_factory):
    record, report = smoke
    out = {}
    info = subprocess.run([sys.executable, "-m", "ddptop", "info", str(record), "--json"], capture_output=True,
                          text=True, timeout=60)
    assert info.returncode == 0, info.stderr
    out["info"] = {s["index"]: s for s in json.loads(info.stdout)["segments"]}
    folder = tmp_path_factory.mktemp("csv")
    assert main(["export", str(record), "--csv", str(folder)]) == 0
    with open(folder / "segments.csv") as f:
        out["export"] = {int(r["segment"]): {k: float(v) for k, v in r.items() if k in KEYS} for r in csv.DictReader(f)}
    out["replay"] = {row["segment"]: row for row in metrics.table_rows(_replayed(str(record)).segment_figures)}
    out["report"] = {int(r["segment"]): r for r in table_rows(report / "report.md")}
    return out


def _replayed(path: str):
    """Play the whole file into SessionState, as the replay screen does (16×), and take its snapshot."""
    state = SessionState()
    source = ReplaySource(path, speed=16)
    try:
        deadline = time.monotonic() + 60
        while not source.finished and time.monotonic() < deadline:
            state.apply_all(source.poll())
            time.sleep(0.02)
        state.apply_all(source.poll())
    finally:
        source.close()
    return state.snapshot()


def test_info_export_and_the_replayed_screen_agree_exactly(figures):
    info, export, replay = figures["info"], figures["export"], figures["replay"]
    assert sorted(info) == sorted(export) == sorted(replay) == [0, 1, 2, 3, 4]
    for segment in info:
        for key in KEYS:
            a, b, c = float(info[segment][key]), float(export[segment][key]), float(replay[segment][key])
            assert _same(a, b) and _same(a, c), (segment, key, a, b, c)


SQL = """
WITH per_rank AS (
  SELECT g.segment, st.rank, count(*) AS n, avg(st.iter_s) AS step_s, avg(st.compute_s) AS compute_s,
         avg(st.comm_s) AS comm_s, avg(st.exposed_comm_s) AS exposed_comm_s, avg(st.own_s) AS own_s,
         avg(st.tx_bytes) AS tx, sum(st.batch_size) AS images, sum(st.iter_s) AS time_s
  FROM steps st JOIN segments g ON st.segment = g.segment
  WHERE st.step >= g.step + ? AND NOT st.sampled
  GROUP BY g.segment, st.rank)
SELECT segment, max(step_s), avg(step_s), avg(compute_s), avg(comm_s), avg(exposed_comm_s), avg(own_s), avg(tx) / 1e6,
       sum(images) / max(time_s), (SELECT n FROM per_rank p WHERE p.segment = r.segment ORDER BY step_s DESC LIMIT 1)
FROM per_rank r GROUP BY segment ORDER BY segment
"""
SQL_KEYS = ("step_s_slowest", "step_s_mean", "compute_s", "comm_s", "exposed_comm_s", "ddptop_s", "sent_mb",
            "images_per_s", "measured_steps")


def test_the_figures_are_what_sql_computes_from_the_recordings_rows(smoke, figures):
    """Ground truth beside the four consumers (which all call one function): the same figures from the `steps`
    rows by SQL alone: each segment's rows from its first step + the sweep's warm-up, sampled steps left out,
    per-rank means, the slowest rank's mean, the mean over ranks, every rank's images over the slowest one's time."""
    import sqlite3

    from smoke_run import WARMUP

    with sqlite3.connect(str(smoke[0])) as db:
        rows = db.execute(SQL, (WARMUP,)).fetchall()
    info = figures["info"]
    assert [row[0] for row in rows] == sorted(info) == [0, 1, 2, 3, 4]
    for segment, *values in rows:
        for key, want in zip(SQL_KEYS, values):
            assert float(info[segment][key]) == pytest.approx(want, rel=1e-9, abs=1e-12), (segment, key)


def test_the_report_prints_the_same_numbers(figures):
    info, report = figures["info"], figures["report"]
    columns = {"step_s_slowest": ("mean s/step (slowest rank)", 1), "step_s_mean": ("mean s/step (mean over ranks)", 1),
               "median_step_s_slowest": ("median s/step (slowest rank)", 1), "images_per_s": ("img/s", 1),
               "compute_s": ("compute s", 1), "comm_s": ("comm s", 1), "exposed_comm_s": ("exposed comm s", 1),
               "overlap": ("overlap %", 100), "ddptop_s": ("ddptop ms/step", 1000), "final_loss": ("final loss", 1)}
    for segment, row in report.items():
        for key, (column, scale) in columns.items():
            printed = row[column]
            decimals = len(printed.split(".")[1]) if "." in printed else 0
            assert float(printed) == pytest.approx(scale * info[segment][key], abs=0.6 * 10 ** -decimals), (key, row)


def _same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == pytest.approx(b, rel=1e-9, abs=1e-12)


def test_the_replayed_screen_shows_the_same_segment_table(smoke, figures):
    """The overview of `ddptop replay` over the whole file prints each segment's row with `info`'s very cells."""
    import asyncio
    import os

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "tui"))
    from screen_text import screen_text

    from ddptop.metrics import tables
    from ddptop.tui.app import DdptopApp

    async def play() -> str:
        source = ReplaySource(str(smoke[0]), speed=16)
        try:
            app = DdptopApp(compose(source), recording=str(smoke[0]))
            async with app.run_test(size=(160, 48)) as pilot:
                deadline = time.monotonic() + 60
                while not source.finished and time.monotonic() < deadline:
                    await pilot.pause(0.2)
                await pilot.pause(1.0)  # the overview redraws every 0.5 s
                return screen_text(app)
        finally:
            source.close()

    screen = asyncio.run(play()).split("\n")
    for segment, row in figures["info"].items():
        cells = tables.cells(row)
        lines = [line for line in screen if line.split()[:2] == [str(segment), cells[1]]]
        assert lines, (segment, cells, "\n".join(screen))
        assert all(cell in lines[0] for cell in cells[3:]), (cells, lines[0])
