"""The what-if model against a fresh lab job (issue 23): fitted on one DDP 25 MB segment of a 3-host job on 1 Gbit/s
links (ddptop/own_profiles/whatif-lab.toml), it predicts every other segment of the same job (DDP 1/5/10/50 MB buckets,
per-parameter all_reduce sync and async, gather+scatter); the truth is each segment's own measured step time (SQL on
the recording's steps table). Prints each error, the median and the max, and exits 1 beyond issue 23's bounds (10%
median, 20% max).

    sudo .venv/bin/python benchmarks/whatif_lab.py [--runs N]      (about 1 min per run on a quiet 2-core machine)

Not part of `make test`: on this 2-core VM a fresh job missed the median bound (12.5% at load 2; per-parameter
strategies predicted 12-22% slow) while the committed recordings meet it (tests/cli/test_advise.py checks those).
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PROFILE = REPO / "ddptop" / "own_profiles" / "whatif-lab.toml"  # DDP 25 MB is segment 1; segment 0 only warms the job up


def measured(db: str) -> dict[int, float]:
    """Each segment's slowest rank's mean step time, by SQL: its first step (warm-up) and sampled steps left out."""
    with sqlite3.connect(db) as con:
        return dict(con.execute("""
            SELECT segment, max(mean) FROM (
              SELECT s.segment, s.rank, avg(s.iter_s) AS mean FROM steps s
              JOIN segments g ON g.segment = s.segment
              WHERE s.sampled = 0 AND s.step > g.step GROUP BY s.segment, s.rank)
            GROUP BY segment""").fetchall())


def one_run(folder: str) -> dict[int, float]:
    db = str(Path(folder) / "run.db")
    lab = subprocess.run([sys.executable, "-m", "ddptop", "lab", "--profile", str(PROFILE), "--headless",
                          "--log-every", "20", "--record", db], cwd=REPO, capture_output=True, text=True, timeout=600)
    if lab.returncode != 0:
        sys.exit(f"the lab job failed (exit {lab.returncode}): {lab.stderr.strip().splitlines()[-1:]}")
    out = subprocess.run([sys.executable, "-m", "ddptop", "advise", db, "--segment", "1", "--json"], cwd=REPO,
                         capture_output=True, text=True, timeout=60, check=True)
    truth = measured(db)
    return {row["segment"]: (row["step_s"] - truth[row["segment"]]) / truth[row["segment"]]
            for row in json.loads(out.stdout)["predictions"] if row["segment"] not in (None, 0, 1)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1)
    args = parser.parse_args()
    ok = True
    for run in range(args.runs):
        with tempfile.TemporaryDirectory() as folder:
            errors = one_run(folder)
        median, worst = statistics.median(abs(e) for e in errors.values()), max(abs(e) for e in errors.values())
        print(f"run {run + 1}: " + " ".join(f"seg {s} {100 * e:+.1f}%" for s, e in sorted(errors.items()))
              + f" | median {100 * median:.1f}% max {100 * worst:.1f}%")
        ok = ok and median <= 0.10 and worst <= 0.20
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
