"""`ddptop advise` on gradient accumulation and compression (issue 25) against measurement the model did not make:
SQL on wire-lab.db (3 lab hosts, the wide MLP, DDP: none, fp16, bf16, powersgd:32, accum 4) and on hpml-lab4-q4's
accum-8 runs, predicted from the plain segment. Each error is checked against README's accuracy claim ("What-if /
advise"): compressed rows within COMPRESSED (2%: their constants were read off wire-lab.db, in-sample); accumulation
predicted too fast, by at most ACCUM_MAX (45%) a run and ACCUM_MEDIAN (25%) in the median, which is outside issue 23's
10% / 20% (README says why: the machine's load on the accum runs, not the configuration). Ignoring accum in the model
gives −56% (wire-lab) and −88% (q4), ignoring compression +19% (fp16) and −68% (powersgd:32): each fails a bound
below. In this process (cli.main): ~2 s."""

from __future__ import annotations

import json
import sqlite3
import statistics

import pytest

from in_process import cli_json, run_cli, slowest_rank_means
from test_advise import REC

Q4 = REC / "hpml-lab4-q4"
COMPRESSED = 0.02  # README: compressed rows within 2% (in-sample constants)
ACCUM_MAX, ACCUM_MEDIAN = 0.45, 0.25  # README: accumulation predicted too fast, at most 45% a run, 25% the median
WIRE_SETTINGS = {(1, "fp16"): 1, (1, "bf16"): 2, (1, "powersgd:32"): 3, (4, "none"): 4}  # segment of each
Q4_RUNS = ("b1024", "b1024-scaled", "b1024-scaled-warmup")


def rows_by_setting(advice: dict) -> dict[tuple[int, str], dict]:
    return {(r["accum"], r["compress"]): r for r in advice["predictions"]
            if r["strategy"] == "ddp" and r["bucket_mb"] == 25.0 and r["world_size"] == 3}


def error(row: dict, truth: float) -> float:
    return (row["step_s"] - truth) / truth


def accum_within_claim(errors) -> bool:
    """Too fast (negative), by no more than ACCUM_MAX each."""
    return all(-ACCUM_MAX <= e < 0 for e in errors)


def test_wire_lab_compression_and_accumulation_from_the_plain_segment():
    """The compressed rows within 2% (measured +0.1%, +0.1%, −0.3%); the accum row too fast within 45% (measured
    −40.9%: its micro-steps took 1.74× the plain step's wall time for no more CPU, at 13-16% of the hosts' 0.67-core
    quota: the machine, not the quota; README)."""
    advice = cli_json("advise", str(REC / "wire-lab.db"), "--json")
    truth = slowest_rank_means(REC / "wire-lab.db", warmup=10)
    rows = rows_by_setting(advice)
    assert advice["from_segment"] == 0
    for setting, segment in WIRE_SETTINGS.items():
        assert rows[setting]["segment"] == segment
        assert rows[setting]["measured_step_s"] == pytest.approx(truth[segment], rel=1e-5)
    found = {s: error(rows[s], truth[rows[s]["segment"]]) for s in rows if rows[s]["segment"] not in (None, 0)}
    print({s: f"{100 * e:+.1f}%" for s, e in found.items()})
    assert set(found) == set(WIRE_SETTINGS), found
    assert all(abs(e) <= COMPRESSED for (accum, _), e in found.items() if accum == 1), found
    assert accum_within_claim(e for (accum, _), e in found.items() if accum > 1), found


def test_accumulation_8_from_the_batch_128_run():
    """hpml-lab4-q4: the same 2 hosts ran batch 64 per host (b128) and accum 8 (three runs, lr and warm-up apart,
    which do not change a step's work). From b128 predict accum 8: too fast in each run, by at most 45%, the median
    within 25% (measured −21.1%, −9.9%, −42.9%; the three runs of one configuration differ by 58% among themselves:
    1.32-2.08 s)."""
    advice = cli_json("advise", str(Q4 / "hpml-lab4-q4-b128.db"), "--accum", "8", "--json")
    row = next(r for r in advice["predictions"] if r["accum"] == 8 and r["compress"] == "none")
    assert row["strategy"] == "ddp" and row["segment"] is None  # measured in other files
    found = {name: error(row, slowest_rank_means(Q4 / f"hpml-lab4-q4-{name}.db", warmup=1)[0]) for name in Q4_RUNS}
    print({name: f"{100 * e:+.1f}%" for name, e in found.items()})
    assert accum_within_claim(found.values()), found
    assert statistics.median(abs(e) for e in found.values()) <= ACCUM_MEDIAN, found


@pytest.mark.parametrize("argv, words", [
    (["--compress", "zip"], "--compress"),
    (["--compress", "fp16:4"], "--compress"),
    (["--accum", "0"], "--accum"),
    (["--segment", "1"], "compress=fp16"),  # a compressed segment's collectives hold the cast: refused
])
def test_bad_settings_are_one_line_and_exit_2(argv, words):
    got, out, err = run_cli("advise", str(REC / "wire-lab.db"), *argv)
    assert (got, out) == (2, "") and len(err.strip().splitlines()) == 1 and words in err, err


def test_the_best_configuration_trains_the_fitted_segments_samples_a_step():
    """Fitted on an accum-8 run, the accum-1 rows are 8× faster a step for an eighth of the samples: the best line
    names a configuration at accum 8 (the same race), never one of them."""
    code, out, err = run_cli("advise", str(Q4 / "hpml-lab4-q4-b1024.db"), "--accum", "1,8")
    assert code == 0, err
    advice = cli_json("advise", str(Q4 / "hpml-lab4-q4-b1024.db"), "--accum", "1,8", "--json")
    fastest = min(advice["predictions"], key=lambda r: r["step_s"])
    assert fastest["accum"] == 1, fastest  # the race the best line must not take part in
    best = out.strip().splitlines()[-1]
    assert best.startswith("best at 2 ranks: ") and "accum 8" in best, best


def test_every_text_row_names_its_accum_and_compression_as_the_recording_ran_it():
    """Issue 44: the text table named accum and compression only where they were not 1 and none ("allreduce yes
    362 ms" carried no label; the screen's table shows both). Each row now has an accum and a compress column (the
    first two after the 30-character configuration), one row per prediction; a measured row's pair is its segment's
    as the recording holds it (SQL on wire-lab.db's segments: none, fp16, bf16, powersgd:32, accum 4)."""
    db = REC / "wire-lab.db"
    code, out, err = run_cli("advise", str(db))
    assert code == 0, err
    advice = cli_json("advise", str(db), "--json")
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as con:
        ran = {s: json.loads(c) for s, c in con.execute("SELECT segment, config FROM segments")}
    lines = out.splitlines()
    assert lines[1].split()[:3] == ["configuration", "accum", "compress"], lines[1]
    rows = lines[2:lines.index(next(line for line in lines if line.startswith("constants")))]  # the constants follow
    table = [(line[:30].strip(), *line[30:].split()[:2]) for line in rows if not line.startswith("  n/a")]
    assert len(table) == len(advice["predictions"]) == 16, out  # 13 replicated configurations, zero1-3
    by_name = {}
    for config, accum, compress in table:
        by_name.setdefault(config, set()).add((int(accum), compress))
    for r in advice["predictions"]:
        base = r["strategy"] + (f" {r['bucket_mb']:g} MB" if r["bucket_mb"] is not None else "") + (
            " async" if r["async_op"] else "")
        setting = (r["accum"], r["compress"])
        if r["segment"] is not None:
            assert setting == (ran[r["segment"]]["accum"], ran[r["segment"]]["compress"]), r
        assert setting in by_name.get(base, set()), (base, setting, out)
    assert by_name["ddp 25 MB"] == {(1, "none"), (1, "fp16"), (1, "bf16"), (1, "powersgd:32"), (4, "none")}, by_name
    assert by_name["allreduce async"] == {(1, "none")}, by_name
