"""Every thread of a rank computes with one OpenMP thread count, whatever OMP_NUM_THREADS the user (or torchrun, with
its 1) set, so that ranks under PowerSGD train one model. PowerSGD's math runs in gloo's threads, which take the count
OMP_NUM_THREADS gave when torch loaded; a rank's main thread took cores/N (torch.set_num_threads). Where the two
differed, both ranks' models came apart, bitwise, a few steps after PowerSGD's warm-up: CI saw it when a test
process leaked OMP_NUM_THREADS=2 into later jobs, and a user sees it with `export OMP_NUM_THREADS=4`, or under
torchrun on a machine with more cores than ranks.

Ground truth: the SHA-256 of each rank's parameters when the run ended (RunFinished, from the recording, with SQL).
Before the fix both cases below ended with different fingerprints in 6 of 6 runs (300 steps) and 2 of 2 (40)."""

from __future__ import annotations

import json
import sqlite3

import pytest

from test_run_cli import TINY, ddptop

POWERSGD = ["--strategy", "ddp", "--bucket-mb", "0.02", "--compress", "powersgd:2", "--accum", "2",
            "--batch-size", "8", "--lr", "0.02", "--steps", "40", "--log-every", "1000"]


@pytest.mark.parametrize("omp, flags", [("2", []), ("1", ["--threads", "2"])],
                         ids=["user-omp-2", "torchrun-omp-1-threads-2"])
def test_both_ranks_end_with_one_model_under_powersgd_whatever_omp_num_threads_says(tmp_path, omp, flags):
    record = tmp_path / "run.db"
    done = ddptop("--local", "2", "--record", str(record), *TINY, *POWERSGD, *flags, timeout=300,
                  env={"OMP_NUM_THREADS": omp, "DDPTOP_STATE_DIR": str(tmp_path / "jobs")})
    assert done.returncode == 0, done.stderr
    with sqlite3.connect(f"file:{record}?mode=ro", uri=True) as db:
        ends = [json.loads(d) for (d,) in db.execute("SELECT data FROM events WHERE kind = 'run_finished'")]
        joined = [json.loads(d) for (d,) in db.execute("SELECT data FROM events WHERE kind = 'rank_joined'")]
        compressed = db.execute("SELECT count(*) FROM steps WHERE step > 10").fetchone()[0]
    assert sorted(e["rank"] for e in ends) == [0, 1] and all(e["steps"] == 40 for e in ends)
    assert compressed == 2 * 29  # PowerSGD ran past its 10 warm-up steps on both ranks
    assert ends[0]["fingerprint"] == ends[1]["fingerprint"], ends
    # the count every thread used: the flag, else the user's OMP_NUM_THREADS
    assert {e["threads"] for e in joined} == {2}
    assert "computes with" not in done.stderr  # torch loaded after the command set the count: nothing to say
