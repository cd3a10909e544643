"""`ddptop advise` on the committed lab recordings: the JSON shape of issue 23, every measured_step_s equal to SQL
on the recording's steps table, predictions within the issue's bounds of the segments the model never read, and
bad input as one line with README's exit code. In this process (cli.main): no rank, no lab, ~1 s."""

from __future__ import annotations

import sqlite3
import statistics
from pathlib import Path

import pytest

from in_process import cli_json, run_cli, slowest_rank_means, slowest_rank_standard_errors

REC = Path(__file__).resolve().parents[2] / "recordings"
KEYS = ["strategy", "bucket_mb", "async_op", "accum", "compress", "world_size", "link", "step_s", "n_a",
        "exposed_comm_s", "overlap", "held_bytes", "measured_step_s", "segment", "step_se_s", "measured_step_se_s"]


def advise(*argv: str) -> dict:
    return cli_json("advise", *argv, "--json")


def errors(advice: dict, truth: dict[int, float]) -> dict[int, float]:
    """Relative error of each prediction that has a measured segment, the fitted one left out."""
    out = {}
    for row in advice["predictions"]:
        if row["segment"] is not None and row["segment"] != advice["from_segment"]:
            assert row["measured_step_s"] == pytest.approx(truth[row["segment"]], abs=1e-6)  # JSON keeps 6 decimals
            out[row["segment"]] = (row["step_s"] - truth[row["segment"]]) / truth[row["segment"]]
    return out


def test_the_json_is_issue_23s_shape_with_measured_steps_from_sql():
    advice = advise(str(REC / "cs744-lab.db"))
    assert sorted(advice) == ["best", "constants", "from_segment", "predictions"] and advice["from_segment"] == 3
    # the fitted segment is the first DDP one; every row a physical prediction; α fitted on segment 2 (allreduce)
    assert all(r["step_s"] is not None and r["n_a"] is None for r in advice["predictions"])
    assert [c["name"] for c in advice["constants"]] == ["compute slowdown", "comm slowdown", "DDP bucket copy",
                                                        "collective latency"]
    assert advice["constants"][3]["source"] == "fitted on segment 2's per-parameter all_reduces"
    truth = slowest_rank_means(REC / "cs744-lab.db", warmup=2)
    rows = advice["predictions"]
    assert all(list(r) == KEYS for r in rows)
    assert {(r["strategy"], r["bucket_mb"], r["async_op"]) for r in rows} >= {
        ("ddp", 25.0, False), ("ddp", 1.0, False), ("ddp", 100.0, False), ("allreduce", None, False),
        ("allreduce", None, True), ("gather-scatter", None, False)}
    found = {r["strategy"]: r["segment"] for r in rows if r["segment"] is not None}
    assert found == {"ddp": 3, "allreduce": 2, "gather-scatter": 1}  # single's batch differs: not the same config
    fitted = next(r for r in rows if r["segment"] == 3)
    assert fitted["measured_step_s"] == pytest.approx(truth[3]) and fitted["step_s"] == pytest.approx(truth[3])
    assert all(r["world_size"] == 4 and r["link"] is None for r in rows)


@pytest.mark.parametrize("name, segment, warmup", [
    ("cs744-lab-buckets-spare.db", 2, 2),  # 2 hosts with a core to spare: DDP 25 MB → 5, 10, 50 MB
    ("whatif-lab.db", 0, 1),  # 3 hosts of 0.67 core, batch 8: every configuration (the model's constants' source)
])
def test_predictions_from_one_ddp_segment_are_within_the_issues_bounds(name, segment, warmup):
    """Not cs744-lab.db since its lr 0.01 re-recording: gather-scatter is predicted +26% and +24% from its DDP
    segment (allreduce −3.6%, −6.9%; README's table), over the bound: the model's fixed constants (issue 23)."""
    advice = advise(str(REC / name), "--segment", str(segment))
    found = errors(advice, slowest_rank_means(REC / name, warmup))
    print(name, {s: f"{100 * e:+.1f}%" for s, e in sorted(found.items())})
    assert len(found) >= 2
    assert statistics.median(abs(e) for e in found.values()) <= 0.10, found
    assert max(abs(e) for e in found.values()) <= 0.20, found


GRID = Path(__file__).resolve().parents[2] / "benchmarks" / "whatif-grid"


def test_each_prediction_carries_the_fitted_segments_standard_error_and_each_measured_one_its_own_by_sql():
    """The noise beside each number: every row's step_se_s is the fitted segment's standard error, each measured
    row's measured_step_se_s its segment's, both from the slowest rank's raw step times by SQL; the text shows the
    error's spread (both combined) beside each error and none on the fitted row, which is exact by construction."""
    db = GRID / "whatif-vgg11-unlimited.db"
    advice = advise(str(db), "--segment", "1")
    se = slowest_rank_standard_errors(db, 1)
    assert se[1] > 0.002  # the unshaped link's base: 0.0048 s on 0.354 s over 10 steps (README)
    rows = advice["predictions"]
    assert all(r["step_se_s"] == pytest.approx(se[1], abs=1e-6) for r in rows)
    matched = [r for r in rows if r["segment"] is not None]
    assert len(matched) == 9
    assert all(r["measured_step_se_s"] == pytest.approx(se[r["segment"]], abs=1e-6) for r in matched)
    code, out, _ = run_cli("advise", str(db), "--segment", "1")
    text = out.splitlines()
    fitted = next(r for r in rows if r["segment"] == 1)
    assert code == 0 and text[0].endswith(f"measured {fitted['measured_step_s']:.3f} s/step ± {se[1]:.3f} (the "
                                          "standard error of its steps: every prediction carries it)")
    ten = next(line for line in text if line.startswith("ddp 10 MB "))
    ten_row = next(r for r in rows if r["bucket_mb"] == 10.0)
    spread = (se[1] ** 2 + se[ten_row["segment"]] ** 2) ** 0.5 / ten_row["measured_step_s"]
    assert ten.split()[-1] == f"{100 * spread:.1f}%"
    assert next(line for line in text if line.startswith("ddp 25 MB ")).split()[-1] == "–"


@pytest.mark.parametrize("name", ["whatif-vgg11-100mbit.db", "whatif-vgg11-1gbit.db", "whatif-vgg11-unlimited.db",
                                  "whatif-resnet18-100mbit.db", "whatif-resnet18-1gbit.db",
                                  "whatif-resnet18-unlimited.db"])
def test_fresh_lab_jobs_at_three_links_and_two_models_are_predicted_within_the_issues_bounds(name):
    """benchmarks/whatif_grid.py's jobs (README "What-if / advise": the table): fitted on DDP 25 MB (segment 1), 7
    other configurations each, truth by SQL. The profile's last segment, DDP 25 MB again, matches the fitted row
    (advise's rows name the first segment of a configuration), so it is not among the 7."""
    advice = advise(str(GRID / name), "--segment", "1")
    found = errors(advice, slowest_rank_means(GRID / name, 1))
    found.pop(0)  # the sweep's DDP 100 MB warm-up segment: neither fitted nor checked (ddptop/own_profiles/whatif-lab.toml)
    print(name, {s: f"{100 * e:+.1f}%" for s, e in sorted(found.items())})
    assert len(found) == 7
    assert statistics.median(abs(e) for e in found.values()) <= 0.10, found
    assert max(abs(e) for e in found.values()) <= 0.20, found


def test_a_transfer_slowed_beside_the_backward_pass_is_fitted_from_the_segments_own_buckets():
    """resnet18-unlimited's DDP 25 MB segment: its first bucket ran beside the backward pass, its second alone, on
    every sampled step (link.fit_comm_slowdown). The 50 MB segment's one bucket runs after the backward pass, all of
    it exposed: predicted from segment 1 against SQL's mean over the ranks of segment 5's exposed communication:
    0.124 s against 0.125 s (fitted: 1.59, 2.6× beside). With compute.py's constant (1.2× beside) it came out 0.233 s
    (+86%); the grid's first recording of this job, 0.198 s against 0.097 s (+104%)."""
    name = GRID / "whatif-resnet18-unlimited.db"
    advice = advise(str(name), "--segment", "1")
    row = next(r for r in advice["predictions"] if r["segment"] == 5)
    assert (row["strategy"], row["bucket_mb"]) == ("ddp", 50.0)
    with sqlite3.connect(name) as con:
        (exposed,) = con.execute("""SELECT avg(s.exposed_comm_s) FROM steps s JOIN segments g ON g.segment = s.segment
                                    WHERE s.segment = 5 AND s.sampled = 0 AND s.step > g.step""").fetchone()
    print(f"50 MB exposed: predicted {row['exposed_comm_s']:.3f} s, measured {exposed:.3f} s")
    assert row["exposed_comm_s"] == pytest.approx(exposed, rel=0.15)
    found = errors(advice, slowest_rank_means(name, 1))
    found.pop(0)
    assert statistics.median(abs(e) for e in found.values()) <= 0.10, found


def test_weak_scaling_from_4_hosts_predicts_2_hosts():
    """hpml-lab4-lab ran the same DDP job on 4 and on 2 of the lab's hosts: from 4, predict 2 (batch 32 per rank)."""
    four = advise(str(REC / "hpml-lab4-lab" / "hpml-lab4-lab-4nodes.db"), "--segment", "2", "--world-sizes", "2")
    row = next(r for r in four["predictions"] if r["strategy"] == "ddp" and r["bucket_mb"] == 25.0)
    assert row["world_size"] == 2 and row["segment"] is None  # another world size: nothing measured in this file
    two = slowest_rank_means(REC / "hpml-lab4-lab" / "hpml-lab4-lab-2nodes.db", warmup=1)[2]
    assert row["step_s"] == pytest.approx(two, rel=0.10)


@pytest.mark.parametrize("argv, code, words", [
    (["--segment", "99"], 2, "no segment 99"),
    (["--links", "10gbit"], 2, "--links needs --link"),
    (["--buckets", "five"], 2, "--buckets"),
    (["--world-sizes", "0"], 2, "--world-sizes"),
    (["--link", "1gbit", "--links", "fast"], 2, "fast"),
    (["--segment", "0"], 2, "segment 0 has no sampled collectives"),  # single: nothing to fit the link on
])
def test_bad_flags_are_one_line_and_exit_2(argv, code, words):
    got, out, err = run_cli("advise", str(REC / "cs744-lab.db"), *argv)
    assert (got, out) == (code, "") and len(err.strip().splitlines()) == 1 and words in err, err


def test_a_file_that_is_not_a_recording_is_one_line_and_exit_6(tmp_path):
    bad = tmp_path / "bad.db"
    bad.write_text("not sqlite")
    got, out, err = run_cli("advise", str(bad))
    assert (got, out) == (6, "") and len(err.strip().splitlines()) == 1, err


def test_a_recording_without_its_run_started_event_is_one_line_and_exit_6(tmp_path):
    copy = tmp_path / "cut.db"
    copy.write_bytes((REC / "whatif-lab.db").read_bytes())
    with sqlite3.connect(copy) as con:
        con.execute("DELETE FROM events WHERE kind = 'run_started'")
    got, out, err = run_cli("advise", str(copy))
    assert (got, out) == (6, "") and len(err.strip().splitlines()) == 1 and "no parameter layout" in err, err
