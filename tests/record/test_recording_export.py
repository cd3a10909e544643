"""Exports: a Chrome trace Perfetto opens (valid JSON, a process per rank, lanes that nest) and CSV tables."""

from __future__ import annotations

import csv
import json
import time
from collections import defaultdict

import pytest

from ddptop.cli import main
from ddptop.control.client import ControlClient
from ddptop.errors import UsageError
from ddptop.events import RunState, Span, StepDone, StepSpans
from ddptop.record.export import parse_steps
from ddptop.record.reader import Recording
from ddptop.record.sqlite import RecordingWriter, base_meta
from ddptop.metrics.traffic import between_steps
from jobs import connect, run_job, steps_of, tiny_config
import ports

STEP_COLUMNS = {"rank", "step", "time", "iter_s", "compute_s", "comm_s", "exposed_comm_s", "overlap", "loss",
                "strategy", "bucket_mb", "async_op", "batch_size", "segment", "comm_bytes"}
SYSTEM_COLUMNS = {"rank", "time", "cpu_percent", "mem_rss_bytes", "gpu_util", "net_iface", "net_rx_bytes",
                  "net_tx_bytes"}


def export(*args: str) -> int:
    return main(["export", *args])


def slices(trace: dict) -> list[dict]:
    return [e for e in trace["traceEvents"] if e["ph"] == "X"]


def test_chrome_trace_has_every_rank_and_lane(recording, tmp_path, capsys):
    out = tmp_path / "trace.json"
    assert export(recording, "--chrome-trace", str(out)) == 0
    assert "trace events" in capsys.readouterr().out
    trace = json.loads(out.read_text())
    xs = slices(trace)
    assert {e["pid"] for e in xs} == {0, 1}
    assert all(e["ts"] >= 0 and e["dur"] >= 0 and isinstance(e["name"], str) for e in xs)
    names = {e["args"]["name"] for e in trace["traceEvents"] if e["ph"] == "M" and e["name"] == "thread_name"}
    assert {"step", "data", "compute", "comm", "optimizer"} <= names
    for rank in (0, 1):
        mine = [e for e in xs if e["pid"] == rank]
        assert sorted(e["name"] for e in mine if e["cat"] == "step") == sorted(f"step {i}" for i in range(8))
        assert any(e["cat"] == "comm" and e["name"].startswith("bucket ") for e in mine)
        assert any(e["cat"] == "fwd" for e in mine) and any(e["cat"] == "bwd" for e in mine)
    process_names = [e for e in trace["traceEvents"] if e["ph"] == "M" and e["name"] == "process_name"]
    assert sorted(e["pid"] for e in process_names) == [0, 1]
    assert all(e["args"]["name"].startswith(f"rank {e['pid']} (") for e in process_names)


def test_steps_window_cuts_the_trace(recording, tmp_path):
    out = tmp_path / "cut.json"
    assert export(recording, "--chrome-trace", str(out), "--steps", "2:4") == 0
    xs = slices(json.loads(out.read_text()))
    assert sorted({e["name"] for e in xs if e["cat"] == "step"}) == ["step 2", "step 3"]
    # spans every 2nd step from the segment's second: steps 1, 3, 5, 7
    assert {e["args"]["step"] for e in xs if e["cat"] != "step"} == {3}


def test_overlapping_collectives_get_their_own_rows(tmp_path):
    """async_op launches every all_reduce at once: overlapping slices on one thread would not nest in Perfetto."""
    path = str(tmp_path / "async.db")
    writer = RecordingWriter(path, base_meta({}, {}))
    comm = tuple(Span("comm", f"allreduce p{i}", 0.01 * i, 0.05, 100, 100, 100) for i in range(4))
    writer.handle([StepDone(0, 0, 0, 0, 1.2, 0.2, 0, 0.1, 0.1, 0, 0, 1, 1.0, 0, 0, 0, True),
                   StepSpans(0, 0, 0, 1.0, (Span("bwd", "a", 0.0, 0.1),) + comm)])
    writer.close()
    out = tmp_path / "async.json"
    assert export(path, "--chrome-trace", str(out)) == 0
    by_tid = defaultdict(list)
    for e in slices(json.loads(out.read_text())):
        by_tid[e["tid"]].append((e["ts"], e["ts"] + e["dur"]))
    comm_tids = {e["tid"] for e in slices(json.loads(out.read_text())) if e["cat"] == "comm"}
    assert len(comm_tids) > 1
    for intervals in by_tid.values():
        intervals.sort()
        assert all(a[1] <= b[0] + 1e-3 for a, b in zip(intervals, intervals[1:]))


def test_csv_tables(recording, tmp_path, capsys):
    folder = tmp_path / "csv"
    assert export(recording, "--csv", str(folder)) == 0
    with open(folder / "steps.csv") as f:
        steps = list(csv.DictReader(f))
    assert STEP_COLUMNS <= set(steps[0]) and len(steps) == 16
    assert {(int(r["rank"]), int(r["step"])) for r in steps} == {(r, s) for r in (0, 1) for s in range(8)}
    assert {r["strategy"] for r in steps} == {"ddp"} and all(float(r["iter_s"]) > 0 for r in steps)
    with open(folder / "system.csv") as f:
        system = list(csv.DictReader(f))
    assert SYSTEM_COLUMNS <= set(system[0]) and {r["rank"] for r in system} == {"0", "1"}
    for rank in ("0", "1"):
        rx = [int(r["net_rx_bytes"]) for r in system if r["rank"] == rank]
        assert rx == sorted(rx)  # totals since the run started never go down


def test_segments_csv_says_each_sharded_segments_unit_and_nothing_for_the_others(tmp_path):
    """A real 2-rank sweep recorded: ddp still carrying a unit (as after a live switch from zero3: SyncConfig keeps
    it for the next sharded segment), zero3 sharded by Conv2d, zero2 by its default (each top-level block). The
    segments.csv `shard_unit` column equals SQL on the recording's segments: the unit where the strategy shards,
    empty elsewhere and for the default."""
    import dataclasses
    import sqlite3

    from ddptop.config import SyncConfig

    sweep = (SyncConfig(strategy="ddp", batch_size=16, shard_unit="Conv2d"),
             SyncConfig(strategy="zero3", batch_size=16, shard_unit="Conv2d"),
             SyncConfig(strategy="zero2", batch_size=16))
    cfg = dataclasses.replace(tiny_config(steps=12), sweep=sweep, sweep_warmup=1, sweep_measure=3)
    code, events = run_job(cfg, world_size=2, timeout_s=120)
    assert code == 0
    path = str(tmp_path / "sweep.db")
    writer = RecordingWriter(path, base_meta({"model": "tiny"}, {"source": "local", "world_size": 2}, ["ddptop"]),
                             clock="events")
    writer.handle(events)
    writer.close()
    assert export(path, "--csv", str(tmp_path / "csv")) == 0
    with open(tmp_path / "csv" / "segments.csv", newline="") as f:
        exported = {int(r["segment"]): r["shard_unit"] for r in csv.DictReader(f)}
    with sqlite3.connect(path) as con:
        recorded = {segment: (json.loads(config)["strategy"], json.loads(config)["shard_unit"])
                    for segment, config in con.execute("SELECT segment, config FROM segments")}
    assert recorded == {0: ("ddp", "Conv2d"), 1: ("zero3", "Conv2d"), 2: ("zero2", "")}, recorded
    assert exported == {s: unit if strategy in ("zero2", "zero3") else "" for s, (strategy, unit) in recorded.items()}


@pytest.mark.parametrize("text,expected", [("2:4", (2, 4)), (":4", (None, 4)), ("3:", (3, None)), ("", (None, None))])
def test_parse_steps(text, expected):
    assert parse_steps(text) == expected


@pytest.mark.parametrize("text", ["4:2", "a:b", "3", "-1:2", "2:2"])
def test_bad_steps_window(text):
    with pytest.raises(UsageError, match="--steps"):
        parse_steps(text)


def test_export_needs_an_output(recording, capsys):
    assert export(recording) == 2
    assert "nothing to export" in capsys.readouterr().err


@pytest.fixture(scope="module")
def paused(tmp_path_factory):
    """A real 2-rank job paused by the test for PAUSE_S at a step boundary, then resumed and stopped, recorded."""
    port = ports.port()
    times: dict[str, float] = {}

    def script(collected):
        client = _connect(port)
        client.send("pause")
        deadline = time.monotonic() + 30
        while not any(isinstance(e, RunState) and e.paused and e.rank == 0 for e in list(collected)):
            assert time.monotonic() < deadline, "the job never paused"
            time.sleep(0.05)
        time.sleep(PAUSE_S)
        times["resumed"] = time.time()
        client.send("resume")
        time.sleep(0.5)
        client.send("stop")

    cfg = tiny_config(strategy="allreduce", steps=100000, span_every=5)
    code, events = run_job(cfg, world_size=2, port=port, token=TOKEN, script=script, timeout_s=30)
    assert code == 0
    path = str(tmp_path_factory.mktemp("paused") / "paused.db")
    writer = RecordingWriter(path, base_meta({}, {"source": "local", "world_size": 2}))
    writer.handle(events)
    writer.close()
    return path, events, times


PAUSE_S = 1.5
TOKEN = "export-pause-token"


def _connect(port: int) -> ControlClient:
    return connect(port, TOKEN, 30)


def test_a_paused_step_starts_at_its_boundary_not_after_the_pause(paused, tmp_path):
    """The step the pause fell in began before the rank paused: its trace bar starts there and ends where the
    step ended, and a NIC sample read during the pause splits the traffic between two steps (nothing in flight)."""
    path, events, times = paused
    for rank in (0, 1):
        paused_at = next(e.t for e in events if isinstance(e, RunState) and e.paused and e.rank == rank)
        steps = sorted(steps_of(events, rank), key=lambda d: d.t)
        held = next(d for d in steps if d.t > times["resumed"])  # the first step to end after the pause
        assert held.iter_s < PAUSE_S / 2  # the pause is not step time
        out = tmp_path / f"trace{rank}.json"
        assert export(path, "--chrome-trace", str(out)) == 0
        trace = json.loads(out.read_text())
        with Recording.open(path) as rec:
            origin = rec.start
        bar = next(e for e in slices(trace) if e["pid"] == rank and e["name"] == f"step {held.step}")
        start, end = origin + bar["ts"] / 1e6, origin + (bar["ts"] + bar["dur"]) / 1e6
        assert start <= paused_at + 0.01 and end == pytest.approx(held.t, abs=0.05)
        assert between_steps(steps)((paused_at + times["resumed"]) / 2)
