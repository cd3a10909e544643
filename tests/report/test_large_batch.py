"""The shipped hpml-lab4-q4 recordings (HPML Lab 4 Q4, issue 25): the report's "Large batches" table and its
accumulation/compression figure against SQL on the files: the global batch, the samples, the last epoch's
training loss and test accuracy, the share of the gap a remedy closed, and the figure's step times, formula bytes
per sample and the loss after the same number of samples."""

from __future__ import annotations

import math
import sqlite3
import statistics
from pathlib import Path

import pytest

from ddptop.report import settings
from ddptop.report.labels import short_names
from ddptop.report.runs import load

ROOT = Path(__file__).resolve().parents[2]
FOLDER = ROOT / "recordings" / "hpml-lab4-q4"
NAMES = ("b128", "b1024", "b1024-scaled", "b1024-scaled-warmup")


@pytest.fixture(scope="module")
def q4():
    paths = [FOLDER / f"hpml-lab4-q4-{name}.db" for name in NAMES]
    if not all(p.exists() for p in paths):
        pytest.skip("recordings/hpml-lab4-q4/ is not in this checkout")
    runs = [load(str(p), label=name) for p, name in zip(paths, NAMES)]
    dbs = {name: sqlite3.connect(f"file:{p}?mode=ro", uri=True) for p, name in zip(paths, NAMES)}
    return runs, dbs


def by_sql(db: sqlite3.Connection) -> dict:
    """What the table shows of one run, computed here from the file alone."""
    ranks = db.execute("SELECT count(DISTINCT rank) FROM steps").fetchone()[0]
    (batch,) = {b for (b,) in db.execute("SELECT DISTINCT batch_size FROM steps")}  # K·b per rank and step
    samples = db.execute("SELECT sum(batch_size) FROM steps").fetchone()[0]
    epoch = db.execute("SELECT max(epoch) FROM steps").fetchone()[0]
    loss = db.execute("SELECT avg(loss) FROM steps WHERE epoch = ?", (epoch,)).fetchone()[0]
    correct, total = db.execute(
        "SELECT sum(json_extract(data, '$.correct')), sum(json_extract(data, '$.total')) FROM events "
        "WHERE kind = 'epoch_done' AND json_extract(data, '$.epoch') = ?", (epoch,)).fetchone()
    lr, warmup = db.execute("SELECT json_extract(config, '$.lr'), json_extract(config, '$.lr_warmup_steps') "
                            "FROM segments").fetchone()
    return {"batch": batch * ranks, "samples": samples, "epoch": epoch + 1, "loss": loss,
            "accuracy": correct / total, "lr": lr, "warmup": warmup}


def test_the_large_batch_table_is_sql_on_the_recordings(q4):
    runs, dbs = q4
    blocks = settings.large_batch_blocks(runs, [r.segments for r in runs])
    header, rows = blocks[-1][1], blocks[-1][2]
    shown = {row[0]: dict(zip(header, row)) for row in rows}
    want = {name: by_sql(db) for name, db in dbs.items()}
    assert set(shown) == set(NAMES)
    for name, row in shown.items():
        w = want[name]
        assert (int(row["global batch"]), float(row["lr"]), int(row["samples"]), int(row["epoch"])) == \
            (w["batch"], w["lr"], w["samples"], w["epoch"])
        assert row["warm-up steps"] == (str(w["warmup"]) if w["warmup"] else "–")
        assert float(row["training loss"]) == pytest.approx(w["loss"], abs=5e-4)
        assert float(row["test accuracy"].rstrip("%")) == pytest.approx(100 * w["accuracy"], abs=0.05)
        base = want["b128"]
        assert float(row["accuracy vs smallest (pp)"]) == pytest.approx(100 * (w["accuracy"] - base["accuracy"]),
                                                                        abs=0.05)
    assert {w["samples"] for w in want.values()} == {want["b128"]["samples"]}  # the same samples: the premise
    assert (want["b128"]["batch"], want["b1024"]["batch"]) == (128, 1024)
    whole = want["b128"]["accuracy"] - want["b1024"]["accuracy"]
    for name in ("b1024-scaled", "b1024-scaled-warmup"):
        closed = (want[name]["accuracy"] - want["b1024"]["accuracy"]) / whole
        assert shown[name]["gap closed"] == f"{100 * closed:.0f}%"
    assert shown["b128"]["gap closed"] == shown["b1024"]["gap closed"] == "–"


def slowest_mean(db: sqlite3.Connection, warmup: int) -> float:
    """The slowest rank's mean step time over the measured steps (warm-up and sampled steps left out)."""
    ranks = [r for (r,) in db.execute("SELECT DISTINCT rank FROM steps")]
    return max(statistics.fmean([t for (t,) in db.execute(
        "SELECT iter_s FROM steps WHERE rank = ? AND step >= ? AND sampled = 0", (r, warmup))]) for r in ranks)


def test_the_accum_figure_draws_sql_on_the_recordings(q4, tmp_path):
    runs, dbs = q4
    stats = [s for r in runs for s in r.segments]
    made = settings.accum_compress(stats, short_names(stats), {r.label: r.points for r in runs}, tmp_path)
    times, _, per_sample, losses = ({b["label"]: b["height"] for b in ax["bars"]} for ax in made.data["axes"])
    samples = min(db.execute("SELECT count(DISTINCT step) * max(batch_size) FROM steps").fetchone()[0]
                  for db in dbs.values())
    for i, (run, (name, db)) in enumerate(zip(runs, dbs.items())):
        assert times["step (slowest rank)"][i] == pytest.approx(
            slowest_mean(db, run.warmup), rel=1e-9)
        tx, batch = db.execute("SELECT avg(tx_bytes), max(batch_size) FROM steps WHERE step >= ? AND sampled = 0",
                               (run.warmup,)).fetchone()
        assert per_sample["formula"][i] == pytest.approx(tx / batch / 1e3, rel=1e-6), name
        step = math.ceil(samples / batch) - 1  # the step where this run had trained `samples` per rank
        loss = db.execute("SELECT avg(loss) FROM steps WHERE step = ?", (step,)).fetchone()[0]
        assert losses[f"after {samples} samples per rank"][i] == pytest.approx(loss, rel=1e-9)


def test_a_figures_title_says_the_accum_every_segment_shown_shares(q4):
    """One run of accum 8 (SQL: its one segment's config): the figures' common words name it; the batch-128 run
    (accum 1) and the four runs together (accum 1 and 8) do not."""
    from ddptop.report.labels import common

    runs, dbs = q4
    (accum,) = dbs["b1024"].execute("SELECT DISTINCT json_extract(config, '$.accum') FROM segments").fetchone()
    assert accum == 8
    stats = {run.label: run.segments for run in runs}
    assert common(stats["b1024"]).endswith(", accum 8"), common(stats["b1024"])
    assert "accum" not in common(stats["b128"]) and "accum" not in common([s for r in runs for s in r.segments])
