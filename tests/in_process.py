"""ddptop's commands run in this process (cli.main: no rank, no lab, ~1 s) on the committed recordings, and what
SQL says of those files, computed apart from ddptop: the advise and what-if tests check one against the other."""

from __future__ import annotations

import contextlib
import io
import json
import sqlite3
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


def slowest_rank_means(db: Path, warmup: int) -> dict[int, float]:
    """Each segment's slowest rank's mean step time, its warm-up and sampled steps left out (SQL, not ddptop)."""
    with sqlite3.connect(db) as con:
        return dict(con.execute("""
            SELECT segment, max(mean) FROM (
              SELECT s.segment, s.rank, avg(s.iter_s) AS mean FROM steps s JOIN segments g ON g.segment = s.segment
              WHERE s.sampled = 0 AND s.step >= g.step + ? GROUP BY s.segment, s.rank)
            GROUP BY segment""", (warmup,)).fetchall())
