"""NULL, NaN, +inf and -inf in every numeric column of every table: each command reads the rest and says what it
left out; none exits 70 or shows a traceback; the report is still written, the bad values left out and said.

The session's real recording is copied and damaged with sqlite3, column by column (README: Recordings). SQLite
stores a NaN as NULL: the NaN row reads back exactly as the NULL one. Before the fix `ddptop report` on a step
time of +inf exited 70 ("Axis limits cannot be NaN or Inf"), and info/export/replay refused the whole file for
one NULL rank.
"""

from __future__ import annotations

import json
import math
import re
import shutil
import sqlite3

import pytest

from ddptop.cli import main
from ddptop.record import schema

BAD = (None, math.nan, math.inf, -math.inf)
TABLES = ("steps", "spans", "system", "events", "segments", "memory")
KEPT = {("steps", "loss")}  # a diverged loss (NaN, inf) is a value worth showing
# copies of what the event's JSON holds, for SQL only: never read as values
UNREAD = {("events", "rank"), ("events", "step"), ("events", "t"), ("segments", "t")}
# columns where NULL is a value ddptop writes: node_cpu_quota NULL = no CPU quota (the node is the whole machine)
NULLABLE = {("system", "node_cpu_quota")}


def numeric_columns() -> list[tuple[str, str]]:
    """Every INTEGER and REAL column of every table but the row keys (SQLite refuses NULL or inf there)."""
    db = sqlite3.connect(":memory:")
    db.executescript(schema.DDL)
    return [(table, name) for table in TABLES
            for _, name, kind, _nn, _default, key in db.execute(f"PRAGMA table_info({table})")
            if kind in ("INTEGER", "REAL") and not key]


def damage(recording: str, folder, columns: list[tuple[str, str]]) -> tuple[str, dict[str, int]]:
    """A copy of `recording` with BAD written into each column, each value into a row of its own (rows spread
    over the table, so the damage is partial). Returns the path and the rows damaged per table."""
    path = str(folder / "damaged.db")
    shutil.copy(recording, path)
    damaged: dict[str, set] = {}
    with sqlite3.connect(path) as db:
        for i, (table, column) in enumerate(columns):
            key = "segment" if table == "segments" else "seq"
            keys = [k for (k,) in db.execute(f"SELECT {key} FROM {table} ORDER BY {key}")]
            # not the first half: the run's start stays readable, and every rank keeps measured steps (with an
            # eighth kept, the job's 16 step rows once left rank 1 only its warm-up step: no step to report on)
            rows = keys[len(keys) // 2:] or keys
            for j, value in enumerate(BAD[:len(rows)]):
                row = rows[(i * len(BAD) + j) % len(rows)]
                db.execute(f"UPDATE {table} SET {column} = ? WHERE {key} = ?", (value, row))
                if (table, column) not in KEPT | UNREAD and not (
                        (table, column) in NULLABLE and (value is None or math.isnan(value))):  # NaN: SQLite's NULL
                    damaged.setdefault(table, set()).add(row)
    db.close()
    return path, {table: len(rows) for table, rows in damaged.items()}


def run(argv: list[str], capsys) -> tuple[int, str, str]:
    code = main(argv)  # in-process: an exception escaping main fails the test (a traceback)
    out, err = capsys.readouterr()
    return code, out, err


def assert_said(err: str, path: str, rows: dict[str, int]) -> None:
    lines = [line for line in err.splitlines() if "left out" in line and "NULL, NaN or infinite" in line]
    if not rows:
        assert not lines, err
        return
    n = sum(rows.values())
    assert len(lines) == 1, err
    assert re.search(rf"{re.escape(path)}: left out {n} rows? holding a NULL, NaN or infinite number", lines[0]), err
    for table, count in rows.items():
        assert f"{table}: {count}" in lines[0], err


@pytest.mark.parametrize("table,column", numeric_columns())
def test_info_export_and_replay_read_around_bad_numbers(recording, tmp_path, capsys, table, column):
    path, rows = damage(recording, tmp_path, [(table, column)])
    for argv in (["info", path], ["info", path, "--json"],
                 ["export", path, "--csv", str(tmp_path / "csv"), "--chrome-trace", str(tmp_path / "t.json")],
                 ["replay", path, "--headless", "--instant"]):
        code, out, err = run(argv, capsys)
        assert code == 0, (argv, err)
        assert "Traceback" not in out + err and "internal error" not in err
        assert_said(err, path, rows)
    trace = json.loads((tmp_path / "t.json").read_text())  # JSON without NaN or Infinity
    assert trace["traceEvents"]
    for csv in ("steps.csv", "system.csv", "segments.csv") if (table, column) not in KEPT else ():  # loss: inf
        text = (tmp_path / "csv" / csv).read_text()
        assert not re.search(r"(?i)(^|,)-?(inf|infinity)(,|$)", text, re.M), csv


@pytest.mark.parametrize("group", ["steps", "step times", "spans system events segments"])
def test_the_report_is_written_without_the_bad_values_and_says_so(recording, tmp_path, capsys, group):
    """Every numeric column of the tables named damaged at once (each in rows of its own): three reports keep the
    suite's time (a report draws 7 figures three ways). "step times": only `t` and `iter_s`, the values that made
    the report exit 70 ("Axis limits cannot be NaN or Inf") where nothing else in the file was refused first."""
    columns = [("steps", "t"), ("steps", "iter_s")] if group == "step times" else \
        [c for c in numeric_columns() if c[0] in group.split()]
    path, rows = damage(recording, tmp_path, columns)
    code, out, err = run(["report", path, "-o", str(tmp_path / "report"), "--formats", "png"], capsys)
    assert code == 0, err
    assert "Traceback" not in out + err and "internal error" not in err
    if rows:
        text = (tmp_path / "report" / "report.md").read_text()
        n = sum(rows.values())  # spans too: the Stragglers table reads their comm spans
        assert f"left out {n} row{'s' if n != 1 else ''} holding a NULL, NaN or infinite number" in text
    figures = json.loads((tmp_path / "report" / "figures.json").read_text())  # allow_nan=False wrote it
    assert figures and (tmp_path / "report" / "report.html").stat().st_size > 0
