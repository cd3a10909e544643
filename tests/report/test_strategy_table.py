"""Seed 004's table from sweeps (issue 43, item 5): two real jobs (2 and 3 local gloo ranks), each sweeping ddp and
zero3 on the tiny model, reported together: one row per strategy and world size, memory per rank as SQL on the
recordings' `memory` tables gives it and against the stages' formula (P from a model built here), step time and
throughput as the same report's per-segment table has them."""

from __future__ import annotations

import sqlite3
import subprocess
import sys

import pytest

from ddptop.train.models import build_model

PROFILE = """
[run]
model = "tiny"
batch_size = 16
synthetic_size = 640
no_eval = true

[sweep]
warmup = 1
measure = 3
configs = [{ strategy = "ddp" }, { strategy = "zero3" }]
"""
WORLDS = (2, 3)


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    folder = tmp_path_factory.mktemp("strategies")
    (folder / "p.toml").write_text(PROFILE)
    records = []
    for world in WORLDS:
        record = folder / f"w{world}.db"
        run = subprocess.run([sys.executable, "-m", "ddptop", "--headless", "--local", str(world), "--profile",
                              str(folder / "p.toml"), "--threads", "1", "--record", str(record)],
                             capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, run.stderr[-3000:]
        records.append(record)
    out = folder / "out"
    run = subprocess.run([sys.executable, "-m", "ddptop", "report", *map(str, records), "-o", str(out), "--formats",
                          "png"],  # the tests read report.md only: SVG and PDF would be drawn for nothing
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    return records, (out / "report.md").read_text()


def table(text: str, title: str) -> list[dict[str, str]]:
    lines = text[text.index(title):].splitlines()
    end = next((i for i, line in enumerate(lines[1:]) if line.startswith("|")), 0)
    rows = []
    for line in lines[1 + end:]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in line.strip("|").split("|")])
    header, body = rows[0], rows[2:]
    return [dict(zip(header, r)) for r in body]


def held_by_sql(record) -> dict[str, int]:
    """strategy → the largest of any rank's parameters + gradients + optimizer state at its latest sample."""
    with sqlite3.connect(record) as db:
        segments = {seg: cfg for seg, cfg in db.execute("SELECT segment, json_extract(config, '$.strategy') "
                                                        "FROM segments")}
        rows = db.execute("SELECT segment, param_bytes + grad_bytes + optim_bytes FROM memory m WHERE seq = "
                          "(SELECT max(seq) FROM memory WHERE segment = m.segment AND rank = m.rank)").fetchall()
    out: dict[str, int] = {}
    for segment, held in rows:
        out[segments[segment]] = max(out.get(segments[segment], 0), held)
    return out


def test_one_row_per_strategy_and_world_size_with_memory_from_sql(report):
    records, text = report
    rows = {(r["strategy"], int(r["ranks"])): r for r in table(text, "## Strategies by world size (seed 004)")}
    assert set(rows) == {(s, w) for s in ("ddp", "zero3") for w in WORLDS}
    size = sum(p.numel() * p.element_size() for p in build_model("tiny").parameters())
    for world, record in zip(WORLDS, records):
        held = held_by_sql(record)
        for strategy in ("ddp", "zero3"):
            row = rows[(strategy, world)]
            assert row["held MB/rank"] == f"{held[strategy] / 1e6:.2f}"
        # SGD with momentum: P + G + O = 3P replicated, 3P/N sharded (FSDP2 pads a shard by a row at most)
        assert rows[("ddp", world)]["by formula MB/rank"] == f"{3 * size / 1e6:.2f}" == rows[("ddp", world)][
            "held MB/rank"]
        assert rows[("zero3", world)]["by formula MB/rank"] == f"{-(-3 * size // world) / 1e6:.2f}"
        drop = held["ddp"] - held["zero3"]
        assert drop == pytest.approx((1 - 1 / world) * 3 * size, rel=0.05)


def test_step_time_and_throughput_are_the_per_segment_tables(report):
    _, text = report
    rows = {(r["strategy"], int(r["ranks"])): r for r in table(text, "## Strategies by world size (seed 004)")}
    for segment in table(text, "## Per segment"):
        strategy = segment["config"].split()[0]
        row = rows[(strategy, int(segment["ranks"]))]
        assert float(row["s/step"]) == pytest.approx(float(segment["mean s/step (slowest rank)"]), abs=6e-4)
        assert float(row["throughput /s"]) == pytest.approx(float(segment["img/s"]), abs=0.06)
        assert row["measured steps"] == segment["steps"]
