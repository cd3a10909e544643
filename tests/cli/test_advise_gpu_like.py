"""The advisor on the device it runs on (issue 42, item 4): a real lab recording whose times are scaled by SQL to a
GPU's (every step, part and span ×1/40: VGG-11's 0.85 s step becomes 21 ms) is fitted without the CPU lab's
constants that do not hold there, and every prediction is a positive step no faster than the compute alone, ordered
as physics orders them. Before, the lab's 2.2 ns a byte of DDP bucket copies (81 ms for VGG-11) was taken out of a
9 ms backward pass, the backward became zero and the predictions at 1 and 2 ranks came out negative (-74 ms)."""

from __future__ import annotations

import io
import json
import shutil
import sqlite3
from pathlib import Path

import pytest

from in_process import cli_json, run_cli

REC = Path(__file__).resolve().parents[2] / "recordings" / "whatif-lab.db"
SCALE = 1 / 40  # compute and communication alike: a GPU's step of a few ms, the same overlap geometry
TIMES = ("iter_s", "data_s", "compute_s", "comm_s", "exposed_comm_s", "fwd_s", "bwd_s", "opt_s", "own_s", "aside_s")


def gpu_like(tmp_path: Path, backend: str | None) -> Path:
    """whatif-lab.db with every recorded duration ×SCALE (steps' parts; spans' starts and lengths), and, where
    `backend` is given, the run's backend set to it."""
    db = tmp_path / "gpu-like.db"
    shutil.copy(REC, db)
    with sqlite3.connect(db) as con:
        con.execute(f"UPDATE steps SET {', '.join(f'{c} = {c} * {SCALE!r}' for c in TIMES)}")
        con.create_function("scaled", 1, lambda text: json.dumps(
            [s[:2] + [s[2] * SCALE, s[3] * SCALE] + s[4:] for s in json.loads(text)]))
        con.execute("UPDATE spans SET spans = scaled(spans)")
        if backend is not None:
            con.execute("UPDATE events SET data = json_set(data, '$.backend', ?) WHERE kind = 'run_started'",
                        (backend,))
    return db


def compute_alone_s(db: Path) -> float:
    """The model's compute alone on the scaled file, by SQL: forward + backward + optimizer of the allreduce sync
    segment (5), where the backward pass ran beside no transfer and made no bucket copies; the slowest rank's mean."""
    with sqlite3.connect(db) as con:
        return con.execute("""
            SELECT max(c) FROM (SELECT avg(s.fwd_s + s.bwd_s + s.opt_s) AS c FROM steps s
              JOIN segments g ON g.segment = s.segment
              WHERE s.segment = 5 AND s.sampled = 0 AND s.step >= g.step + 1 GROUP BY s.rank)""").fetchone()[0]


def predictions(db: Path) -> dict:
    return cli_json("advise", str(db), "--json", "--world-sizes", "1,2,3", "--buckets", "1,25,50")


def check_physical_and_ordered(rows: list[dict], floor: float) -> None:
    """Each shown step positive, no faster than the compute alone (5% for the segments' step-to-step noise), its
    exposed communication inside it; more ranks never faster; async never slower than sync, gather + scatter
    (more bytes) never faster than a ring, wherever both are shown."""
    for r in rows:
        if r["step_s"] is not None:
            assert r["step_s"] >= floor * 0.95 and 0 <= r["exposed_comm_s"] <= r["step_s"], (r, floor)
    by = {(r["strategy"], r["bucket_mb"], r["async_op"], r["world_size"]): r["step_s"] for r in rows}
    for (strategy, mb, async_op, world), step in by.items():
        fewer = by.get((strategy, mb, async_op, world - 1))
        if step is not None and fewer is not None:
            assert step >= fewer - 1e-9, (strategy, mb, async_op, world)
    for world in (2, 3):
        sync, later = by[("allreduce", None, False, world)], by[("gather-scatter", None, False, world)]
        if sync is not None:
            assert by[("allreduce", None, True, world)] <= sync and (later is None or sync <= later)


def test_gpu_like_step_times_on_nccl_give_positive_ordered_predictions(tmp_path):
    """The run's backend set to nccl: none of the CPU lab's gloo figures applies; every prediction is a number."""
    db = gpu_like(tmp_path, "nccl")
    floor = compute_alone_s(db)
    assert 0.005 < floor < 0.02  # the premise: a GPU-like step of a few ms
    advice = predictions(db)
    rows = advice["predictions"]
    check_physical_and_ordered(rows, floor)
    assert rows and all(r["step_s"] is not None and r["n_a"] is None for r in rows), [r["n_a"] for r in rows]
    # the output says which constants it assumed and where they came from: none of them the lab's gloo figures
    assumed = {c["name"]: c for c in advice["constants"]}
    assert set(assumed) == {"compute slowdown", "comm slowdown", "DDP bucket copy", "collective latency"}
    assert all(c["value"] == 0 and c["source"].startswith("assumed 0: the CPU lab's gloo figure is not applied to "
                                                          "nccl") for c in assumed.values()), assumed
    code, out, _ = run_cli("advise", str(db))
    assert code == 0 and "DDP bucket copy 0 ns/B: assumed 0: the CPU lab's gloo figure is not applied to nccl" in out


def test_gpu_like_step_times_on_gloo_never_show_a_step_that_cannot_be(tmp_path):
    """As recorded (gloo, a host 40× the lab's): the lab's copy cost is refused (81 ms of an 8 ms backward pass),
    said so; a prediction the fit cannot make physical is "n/a" with its reason, never a number."""
    db = gpu_like(tmp_path, None)
    floor = compute_alone_s(db)
    advice = predictions(db)
    rows = advice["predictions"]
    check_physical_and_ordered(rows, floor)
    assert all((r["step_s"] is None) == bool(r["n_a"]) for r in rows)
    assert all(r["step_s"] is not None for r in rows if r["world_size"] == 3)  # as run: each a number
    copy = next(c for c in advice["constants"] if c["name"] == "DDP bucket copy")
    assert copy["value"] == 0 and copy["source"].startswith("assumed 0: the lab's 2.2 ns/B would be 81.2 ms"), copy
    code, out, _ = run_cli("advise", str(db), "--world-sizes", "1,2,3")
    assert code == 0 and "-0." not in out, out  # no negative step on the table
    n_a = [r for r in rows if r["step_s"] is None]  # at 1 rank: the lab's α, capped, leaves the fit's calibration
    assert n_a and all(f"{r['n_a']} (" in out for r in n_a)


def test_the_what_if_panel_draws_a_step_that_cannot_be_as_n_a(tmp_path):
    """The panel's table (ddptop.tui.render.whatif) over the same rows: n/a where advise says n/a, never the number."""
    from rich.console import Console

    from ddptop.metrics.whatif.rows import best_row
    from ddptop.record.reader import Recording
    from ddptop.record.whatif import predictions as rows_of
    from ddptop.state.advising import WhatIf
    from ddptop.state.snapshot import Snapshot
    from ddptop.tui.render.whatif import whatif

    with Recording.open(str(gpu_like(tmp_path, None))) as rec:
        seg, rows = rows_of(rec, worlds=(1,))
    one = [r for r in rows if r["world_size"] == 1]
    assert one and all(r["step_s"] is None and r["n_a"] for r in one)  # at 1 rank, as advise gives them
    console = Console(width=160, record=True, file=io.StringIO())
    console.print(whatif(Snapshot(whatif=WhatIf(seg, tuple(rows), best_row(rows, seg))), 160))
    table = console.export_text()
    assert table.count(" n/a ") == len(one) and "-0." not in table and "−0." not in table, table
