"""Advice that trusts what it measured (issue 44): a configuration the recording ran is ranked by its measured step
time, not its prediction, so one measured slower than the configuration in force is never recommended; a gain no
larger than one standard error is "no better within noise". On the committed lab recordings, read by `ddptop advise`
and replayed into the session state the screen draws; every expected number is SQL on the file (in_process)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from ddptop.record.reader import Recording
from ddptop.state.session import SessionState
from in_process import cli_json, run_cli, slowest_rank_means, slowest_rank_standard_errors

REC = Path(__file__).resolve().parents[2] / "recordings"
WHATIF, BUCKETS = REC / "whatif-lab.db", REC / "cs744-lab-buckets.db"


def ddp(advice: dict, mb: float) -> dict:
    return next(r for r in advice["predictions"] if r["strategy"] == "ddp" and r["bucket_mb"] == mb)


def test_a_configuration_measured_slower_than_the_one_in_force_is_not_recommended():
    """whatif-lab's segment 6 (allreduce async): DDP 25 MB is predicted 10% faster, but segment 0 ran it slower."""
    truth = slowest_rank_means(WHATIF, warmup=1)
    argv = ("advise", str(WHATIF), "--segment", "6", "--buckets", "25,50")
    advice = cli_json(*argv, "--json")
    for mb in (25.0, 50.0):  # the premise, by SQL: predicted faster than segment 6, measured slower
        row = ddp(advice, mb)
        assert row["step_s"] < truth[6] < truth[row["segment"]], row
    # every other configuration the recording ran is measured slower too: nothing beats the one in force
    assert all(truth[r["segment"]] >= truth[6] for r in advice["predictions"] if r["segment"] is not None)
    code, out, _ = run_cli(*argv)
    assert code == 0 and out.splitlines()[-1].startswith(
        "best at 3 ranks: allreduce async, the configuration in force: no other is faster"), out
    assert advice["best"]["verdict"] == "in force" and advice["best"]["segment"] == 6


def test_a_measured_configuration_is_ranked_by_its_measurement_in_the_replayed_state():
    """The screen's What-if (the session state, replayed from the file up to the moment every rank finished segment
    6's last step) ranks DDP 5 MB by segment 2's measurement, and its saving is the two segments' measured
    difference."""
    truth = slowest_rank_means(WHATIF, warmup=1)
    state = SessionState()
    with Recording.open(str(WHATIF)) as rec:
        first7 = next(s["step"] for s in rec.segments() if s["index"] == 7)
        state.apply_all(rec.between(-math.inf, rec.time_of_step(first7 - 1)))
    w = state.snapshot().whatif
    assert w.seg.segment == 6 and w.best is not None
    fastest = min(truth, key=truth.get)  # segment 2: DDP 5 MB, the fastest the job measured
    assert (w.best["strategy"], w.best["bucket_mb"], w.best["segment"]) == ("ddp", 5.0, fastest)
    assert w.best["saving_s"] == pytest.approx(truth[6] - truth[fastest], abs=2e-6)
    from ddptop.state.advising import describe
    assert describe(w.best).startswith(f"ddp 5 MB, −{(truth[6] - truth[fastest]) * 1e3:.0f} ms/step") and \
        describe(w.best).endswith(f"measured (#{fastest})")


def test_a_predicted_gain_inside_one_standard_error_is_no_better_within_noise():
    """cs744-lab-buckets's segment 2 (DDP 25 MB, ±107 ms): 1 MB buckets predicted 54 ms faster, inside the noise."""
    truth, se = slowest_rank_means(BUCKETS, warmup=2), slowest_rank_standard_errors(BUCKETS, warmup=2)
    advice = cli_json("advise", str(BUCKETS), "--segment", "2", "--json")
    one = ddp(advice, 1.0)
    assert one["segment"] is None and 0 < truth[2] - one["step_s"] <= se[2]  # the premise, by SQL
    code, out, _ = run_cli("advise", str(BUCKETS), "--segment", "2")
    last = out.splitlines()[-1]
    assert code == 0 and last.startswith("best at 4 ranks: no better within noise: ddp 1 MB") and \
        last.endswith("ddp 25 MB stays"), last
    best = advice["best"]
    assert (best["bucket_mb"], best["verdict"]) == (1.0, "noise") and best["noise_s"] == pytest.approx(se[2], rel=1e-6)


def test_a_measured_gain_inside_both_segments_noise_is_no_better_within_noise():
    """whatif-lab's segment 3 (DDP 10 MB) and segment 2 (DDP 5 MB) measured within a millisecond of each other."""
    truth, se = slowest_rank_means(WHATIF, warmup=1), slowest_rank_standard_errors(WHATIF, warmup=1)
    advice = cli_json("advise", str(WHATIF), "--segment", "3", "--json")
    assert 0 < truth[3] - truth[2] <= math.hypot(se[3], se[2])  # the premise, by SQL
    _, out, _ = run_cli("advise", str(WHATIF), "--segment", "3")
    assert out.splitlines()[-1].startswith("best at 3 ranks: no better within noise: ddp 5 MB"), out
    best = advice["best"]
    assert (best["bucket_mb"], best["segment"], best["verdict"], best["by"]) == (5.0, 2, "noise", "measured")
