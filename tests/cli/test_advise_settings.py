"""`ddptop advise` on gradient accumulation and compression (issue 25) against measurement the model did not make:
SQL on wire-lab.db (3 lab hosts, the wide MLP, DDP: none, fp16, bf16, powersgd:32, accum 4) and on hpml-lab4-q4's
accum-8 runs, predicted from the plain segment. Each bound is README's measured error ("What-if / advise") within
MARGIN: the model and the files are deterministic, so any change to either that moves an error shows here. The
accum errors are the model's known miss, kept as measured (README: the runs' CPU per micro-step matched the plain
step's, their wall time per CPU second did not). Ignoring accum in the model gives −56% (wire-lab) and −88% (q4),
ignoring compression +19% (fp16) and −68% (powersgd:32): every bound below fails then. In this process
(cli.main): ~2 s."""

from __future__ import annotations

import statistics

import pytest

from in_process import cli_json, run_cli, slowest_rank_means
from test_advise import REC

Q4 = REC / "hpml-lab4-q4"
MARGIN = 0.02  # 2 percentage points either side of the measured error (README "What-if / advise")
WIRE_MEASURED = {(1, "fp16"): 0.001, (1, "bf16"): 0.001, (1, "powersgd:32"): -0.003, (4, "none"): -0.409}
Q4_MEASURED = {"b1024": -0.211, "b1024-scaled": -0.099, "b1024-scaled-warmup": -0.429}


def rows_by_setting(advice: dict) -> dict[tuple[int, str], dict]:
    return {(r["accum"], r["compress"]): r for r in advice["predictions"]
            if r["strategy"] == "ddp" and r["bucket_mb"] == 25.0 and r["world_size"] == 3}


def error(row: dict, truth: float) -> float:
    return (row["step_s"] - truth) / truth


def test_wire_lab_compression_and_accumulation_from_the_plain_segment():
    """The compression constants were read off this file (settings.py), so its compressed rows are in-sample
    (measured: +0.1%, +0.1%, −0.3%); the accum row is not: −40.9% (its micro-steps took 1.74× the plain step's wall
    time for no more CPU, at 13-16% of the hosts' 0.67-core quota: the machine, not the quota; README)."""
    advice = cli_json("advise", str(REC / "wire-lab.db"), "--json")
    truth = slowest_rank_means(REC / "wire-lab.db", warmup=10)
    rows = rows_by_setting(advice)
    assert advice["from_segment"] == 0
    for setting, segment in (((1, "fp16"), 1), ((1, "bf16"), 2), ((1, "powersgd:32"), 3), ((4, "none"), 4)):
        assert rows[setting]["segment"] == segment
        assert rows[setting]["measured_step_s"] == pytest.approx(truth[segment], rel=1e-5)
    found = {s: error(rows[s], truth[rows[s]["segment"]]) for s in rows if rows[s]["segment"] not in (None, 0)}
    print({s: f"{100 * e:+.1f}%" for s, e in found.items()})
    assert set(found) == set(WIRE_MEASURED), found
    assert all(abs(found[s] - WIRE_MEASURED[s]) <= MARGIN for s in found), found


def test_accumulation_8_from_the_batch_128_run():
    """hpml-lab4-q4: the same 2 hosts ran batch 64 per host (b128) and accum 8 (three runs, lr and warm-up apart,
    which do not change a step's work). From b128 predict accum 8: measured −21.1%, −9.9%, −42.9% (median 21.1%;
    the three runs of one configuration differ by 58% among themselves: 1.32-2.08 s)."""
    advice = cli_json("advise", str(Q4 / "hpml-lab4-q4-b128.db"), "--accum", "8", "--json")
    row = next(r for r in advice["predictions"] if r["accum"] == 8 and r["compress"] == "none")
    assert row["strategy"] == "ddp" and row["segment"] is None  # measured in other files
    found = {name: error(row, slowest_rank_means(Q4 / f"hpml-lab4-q4-{name}.db", warmup=1)[0]) for name in Q4_MEASURED}
    print({name: f"{100 * e:+.1f}%" for name, e in found.items()})
    assert all(abs(found[n] - Q4_MEASURED[n]) <= MARGIN for n in found), found
    assert statistics.median(abs(e) for e in found.values()) <= 0.211 + MARGIN, found


@pytest.mark.parametrize("argv, words", [
    (["--compress", "zip"], "--compress"),
    (["--compress", "fp16:4"], "--compress"),
    (["--accum", "0"], "--accum"),
    (["--segment", "1"], "compress=fp16"),  # a compressed segment's collectives hold the cast: refused
])
def test_bad_settings_are_one_line_and_exit_2(argv, words):
    got, out, err = run_cli("advise", str(REC / "wire-lab.db"), *argv)
    assert (got, out) == (2, "") and len(err.strip().splitlines()) == 1 and words in err, err
