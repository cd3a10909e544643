"""Each rank's energy (issue 42, item 5) against a fake NVML whose joules the test knows: live-switch.db (2 real CPU
ranks) rewritten through the RecordingWriter with every system sample's GPU read by GpuReader from a fake board,
rank 0's with a total-energy counter advancing at 250 W of the samples' own clock, rank 1's without one (power only:
312.5 W). `info --json`, `info`, the report and the Ranks panel (a replay into the session state) must give what
SQL on the rewritten file gives; a CPU recording says once that there is none, never zeros."""

from __future__ import annotations

import dataclasses
import io
import json
import sqlite3
from pathlib import Path

import pytest

from ddptop.events import SystemSample
from ddptop.metrics.energy import COUNTER, POWER_TIME
from ddptop.record.reader import Recording
from ddptop.record.sqlite import RecordingWriter
from ddptop.sources.gpu import GpuReader
from in_process import run_cli
from unit.test_gpu_nvml import ME, FakeNvml, gpu  # the fake board GpuReader's own tests use

SOURCE = Path(__file__).resolve().parents[2] / "recordings" / "live-switch.db"
WATTS = 250.0  # rank 0's board, by its counter
FALLBACK_W = 312.5  # rank 1's board: FakeNvml's nvmlDeviceGetPowerUsage, 312 500 mW
START_MJ = 9_000_000_000  # the counter counts from the driver's load, not the run's: a large offset


@pytest.fixture(scope="module")
def powered(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("energy") / "powered.db"
    with Recording.open(str(SOURCE)) as rec:
        events, meta = list(rec.events()), dict(rec.meta)
    boards = {0: [gpu()], 1: [gpu(energy_mj=None)]}
    readers = {r: GpuReader([0], nvml=FakeNvml(b), env={}, pid=ME) for r, b in boards.items()}
    t0 = min(e.t for e in events if isinstance(e, SystemSample))
    for i, e in enumerate(events):
        if isinstance(e, SystemSample):
            boards[0][0]["energy_mj"] = START_MJ + round(WATTS * (e.t - t0) * 1000)
            status, gpus = readers[e.rank].read()
            events[i] = dataclasses.replace(e, gpus=gpus, gpu_status=status)
    writer = RecordingWriter(str(path), {k: meta[k] for k in ("config", "rendezvous", "argv", "versions", "created")},
                             clock="events")
    writer.handle(events)
    writer.close()
    return path


def truth(path: Path, rank: int) -> dict:
    """By SQL: the counter's joules between the rank's first and last reading (energy_j, GpuStat's 15th value), the
    steps the front received between them (seq), their samples and exposed communication."""
    with sqlite3.connect(path) as con:
        readings = con.execute("SELECT seq, t, json_extract(gpus, '$[0][14]') FROM system "
                               "WHERE rank = ? AND gpus != '[]' ORDER BY seq", (rank,)).fetchall()
        (s0, t0, e0), (s1, t1, e1) = readings[0], readings[-1]
        steps, samples, exposed = con.execute(
            "SELECT count(*), sum(batch_size), sum(exposed_comm_s) FROM steps WHERE rank = ? AND seq > ? AND seq < ?",
            (rank, s0, s1)).fetchone()
    return {"joules": e1 - e0, "seconds": t1 - t0, "steps": steps, "samples": samples, "exposed_s": exposed}


def test_joules_per_step_and_sample_are_the_counters_by_sql(powered):
    t = truth(powered, 0)
    assert t["joules"] == pytest.approx(WATTS * t["seconds"], abs=1e-3)  # the recording holds the fake's joules
    code, out, err = run_cli("info", str(powered), "--json")
    assert code == 0, err
    e = json.loads(out)["energy"]["0"]
    assert e["source"] == COUNTER and e["steps"] == t["steps"] > 100
    assert e["j_per_step"] == pytest.approx(t["joules"] / t["steps"], rel=1e-9)
    assert e["j_per_sample"] == pytest.approx(t["joules"] / t["samples"], rel=1e-9)
    assert e["watts"] == pytest.approx(WATTS, rel=1e-6)
    assert e["comm_j_per_step"] == pytest.approx(WATTS * t["exposed_s"] / t["steps"], rel=1e-6)
    with sqlite3.connect(powered) as con:  # the period stated: the readings' spacing
        n = con.execute("SELECT count(*) FROM system WHERE rank = 0").fetchone()[0]
    assert e["period_s"] == pytest.approx(t["seconds"] / (n - 1), rel=1e-9)


def test_a_board_without_the_counter_is_power_times_time_and_says_so(powered):
    code, out, _ = run_cli("info", str(powered), "--json")
    e = json.loads(out)["energy"]["1"]
    with sqlite3.connect(powered) as con:  # the steps from its first power reading on
        first = con.execute("SELECT min(seq) FROM system WHERE rank = 1").fetchone()[0]
        steps, time_s, samples = con.execute("SELECT count(*), sum(iter_s), sum(batch_size) FROM steps "
                                             "WHERE rank = 1 AND seq > ?", (first,)).fetchone()
    assert e["source"] == POWER_TIME and e["steps"] == steps
    assert e["j_per_step"] == pytest.approx(FALLBACK_W * time_s / steps, rel=1e-9)
    assert e["j_per_sample"] == pytest.approx(FALLBACK_W * time_s / samples, rel=1e-9)


def test_info_the_report_and_the_ranks_panel_say_the_same(powered, tmp_path):
    from rich.console import Console

    from ddptop.state.session import SessionState
    from ddptop.tui.render.tables import energy_note, ranks_table

    code, out, _ = run_cli("info", str(powered), "--json")
    energy = json.loads(out)["energy"]
    code, text, _ = run_cli("info", str(powered))
    j0 = f"{energy['0']['j_per_step']:.3g} J/step"
    assert code == 0 and f"rank 0: {j0}" in text and "rank 1: " in text and "none measured" not in text
    assert run_cli("report", str(powered), "-o", str(tmp_path / "r"), "--formats", "png")[0] == 0
    report = (tmp_path / "r" / "report.md").read_text()
    assert "## Energy per rank" in report and f"| {energy['0']['j_per_step']:.4g} |" in report
    state = SessionState()
    with Recording.open(str(powered)) as rec:
        state.apply_all(rec.events())
    snap = state.snapshot()
    panel = Console(width=160, record=True, file=io.StringIO())
    panel.print(ranks_table(snap, None, 160), energy_note(snap))
    drawn = panel.export_text()
    assert "J/step" in drawn and f"{energy['0']['j_per_step']:.3g}" in drawn and "read every" in drawn
    assert {r.rank: r.energy.j_per_step for r in snap.ranks} == pytest.approx(
        {int(k): v["j_per_step"] for k, v in energy.items()}, rel=1e-9)


def test_a_cpu_recording_says_once_that_there_is_none(tmp_path):
    code, text, _ = run_cli("info", str(SOURCE))
    assert code == 0 and text.count("energy") == 1, text
    assert "energy     none measured: no GPU reading (not available: this rank trains on the CPU)" in text
    assert "J/step" not in text
