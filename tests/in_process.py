"""ddptop's commands run in this process (cli.main: no rank, no lab, ~1 s) on the committed recordings, and what
SQL says of those files, computed apart from ddptop: the advise and what-if tests check one against the other."""

from __future__ import annotations

import contextlib
import io
import json
import math
import sqlite3
import statistics
from pathlib import Path

from ddptop import cli


def run_cli(*argv: str) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of `ddptop ARGV`."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(list(argv))
    return code, out.getvalue(), err.getvalue()


def cli_json(*argv: str) -> dict:
    """`ddptop ARGV` (a --json command) that must succeed: its output, parsed."""
    code, out, err = run_cli(*argv)
    assert code == 0, err
    return json.loads(out)


def slowest_rank_standard_errors(db: Path, warmup: int) -> dict[int, float]:
    """Each segment's slowest rank's standard error of its mean step time, from the raw rows (SQL, then the sample
    standard deviation over √n here): warm-up and sampled steps left out, as slowest_rank_means."""
    with sqlite3.connect(db) as con:
        rows = con.execute("""
            SELECT s.segment, s.rank, s.iter_s FROM steps s JOIN segments g ON g.segment = s.segment
            WHERE s.sampled = 0 AND s.step >= g.step + ?""", (warmup,)).fetchall()
    times: dict[tuple[int, int], list[float]] = {}
    for segment, rank, t in rows:
        times.setdefault((segment, rank), []).append(t)
    out: dict[int, tuple[float, float]] = {}  # segment → (slowest mean, its standard error)
    for (segment, _), ts in times.items():
        mean = sum(ts) / len(ts)
        se = statistics.stdev(ts) / math.sqrt(len(ts)) if len(ts) > 1 else 0.0
        if segment not in out or mean > out[segment][0]:
            out[segment] = (mean, se)
    return {segment: se for segment, (_, se) in out.items()}


def slowest_rank_means(db: Path, warmup: int) -> dict[int, float]:
    """Each segment's slowest rank's mean step time, its warm-up and sampled steps left out (SQL, not ddptop)."""
    with sqlite3.connect(db) as con:
        return dict(con.execute("""
            SELECT segment, max(mean) FROM (
              SELECT s.segment, s.rank, avg(s.iter_s) AS mean FROM steps s JOIN segments g ON g.segment = s.segment
              WHERE s.sampled = 0 AND s.step >= g.step + ? GROUP BY s.segment, s.rank)
            GROUP BY segment""", (warmup,)).fetchall())
