"""Recordings keep every event exactly, in order, with the run's metadata; the file refuses to be overwritten."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import sqlite3
import time

import pytest

from ddptop.events import ConfigApplied, ControlRefused, RankLost, RunState
from ddptop.errors import RecordingError
from ddptop.events import (EVENT_TYPES, EpochDone, GpuStat, LogLine, MemorySample, NicStat, RankJoined,
                           RunFinished, RunStarted, Span, StepDone, StepSpans, SystemSample, TuneAsked, TuneNote,
                           TuneTrial)
from ddptop.events import EventDecodeError, event_from_dict
from ddptop.record import schema
from ddptop.record.reader import Recording
from ddptop.record.sqlite import RecordingWriter, base_meta

T0 = 1.7e9


def one_of_each() -> list:
    """Every event kind with awkward values: NaN loss, missing GPU readings, unicode, big byte counts."""
    nic = NicStat("eth0", 1.5e8, 1.25e8, 1 << 40, 3, 10, 11, 1, 2, 3, 4, 2e8, 2.5e8)
    shaped = NicStat("veth0", 1.5e8, 1.25e8, 1 << 40, 3, 10, 11, 1, 2, 3, 4, 2e8, 2.5e8, 1e9, "shaped by ddptop lab")
    gpu = GpuStat(0, "H100 ✓", None, 1 << 33, None, 301.25, 55.0)
    spans = (Span("data", "data", 0.0, 1e-4), Span("fwd", "features.0", 1e-4, 0.1 / 3),
             Span("comm", "bucket 0", 0.05, 0.02, 1 << 30, 1 << 30, 1 << 29), Span("opt", "optimizer", 0.07, 1e-3))
    events = [
        RankJoined(0, 2, "node-ü", 123, "cuda:0", "nccl", 8, "2.4", "0.1.0", "torchrun", T0),
        RunStarted("vgg11", "cifar10", 2, "ddp", 25.0, False, 64, 0.1, 9231114, 36924456, 34,
                   (("features.0", 1792), ("classifier", 5130)), 391, T0 + 0.5),
        ConfigApplied(0, 0, 0, {"strategy": "ddp", "bucket_mb": 25.0, "async_op": False, "batch_size": 64,
                                "lr": 0.1}, 0, "start", T0 + 0.6),
        StepDone(0, 0, 0, 0, T0 + 1.0, 0.4, 0.01, 0.3, 0.1, 0.05, 0.5, 64, 2.3025850929940455, 36924456,
                 36924456, 36924456, True),
        StepSpans(0, 0, 0, T0 + 0.6, spans),
        StepDone(1, 0, 0, 0, T0 + 0.99, 0.4, 0.0, 0.3, 0.1, 0.0, 0.0, 64, math.nan, 0, 0, 0, False),
        SystemSample(0, "node-ü", T0 + 1.1, 99.5, 87.25, 1 << 31, 1 << 33, 1 << 35, "eth0", (nic, shaped), (gpu,), "ok",
                     0.67),
        SystemSample(1, "node2", T0 + 1.2, 0.0, 0.0, 0, 0, 0, "lo"),
        EpochDone(0, 0, 390, 2.0345, 2292, 10000, T0 + 2.0),
        LogLine(1, "warning", "línea ✓ (control characters come back escaped: tests/security)", T0 + 2.1),
        ControlRefused(7, "bad MAC: wrong token", T0 + 2.2),
        RunState(0, 5, True, T0 + 2.3),
        RankLost(1, 6, "heartbeat stale for 10 s", T0 + 2.4),
        RunFinished(0, 7, "error: peer lost", T0 + 2.5),
        TuneNote(3, TuneTrial(0, 25.0, 3, 22, 0.0845), (TuneTrial(1, 1.0, 29, 48, 0.108),), 25.0, 0.0, "", T0 + 3),
        TuneAsked(0, 4, "ctl@host:1", T0 + 3.01, "strategy"),
        TuneNote(4, TuneTrial(2, 25.0, 50, 69, 0.0845, 0.001, "ddp", 1 << 33, 1 << 34),
                 (TuneTrial(3, 25.0, 72, 91, 0.07, 0.002, "zero3", 1 << 31, 1 << 34),), 0.0, 0.0145, "", T0 + 3.02,
                 "strategy", "zero3"),
        MemorySample(1, 6, 0, T0 + 3.1, 7364648, 0, 1 << 40, 290607104, 289685504, 0, "process USS", 0.0325),
    ]
    covered = {e.kind for e in events}
    for kind, cls in EVENT_TYPES.items():  # kinds added later still get a round trip
        if kind not in covered:
            events.append(cls(**{f.name: _value(f.type) for f in dataclasses.fields(cls)}))
    return events


def _value(annotation: str):
    return {"int": 7, "float": T0 + 3.0, "str": "x", "bool": True, "dict[str, str]": {"0": "ab"}}.get(annotation, ())


def as_json(events: list) -> list[str]:
    return [json.dumps(e.to_dict()) for e in events]  # NaN == NaN here, unlike dataclass equality


def write(path: str, events: list, batch: int = 3) -> None:
    writer = RecordingWriter(path, base_meta({"model": "vgg11"}, {"source": "torchrun", "world_size": 2}, ["x"]))
    for i in range(0, len(events), batch):
        writer.handle(events[i:i + batch])
    writer.close()


def test_every_event_kind_round_trips_exactly_and_in_order(tmp_path):
    events = one_of_each()
    path = str(tmp_path / "all.db")
    write(path, events)
    with Recording.open(path) as rec:
        back = list(rec.events())
    assert {e.kind for e in events} == set(EVENT_TYPES)
    assert [type(e) for e in back] == [type(e) for e in events]
    assert as_json(back) == as_json(events)
    assert math.isnan(back[5].loss) and back[6].gpus[0].util_percent is None and back[3].sampled is True
    assert back[6].nics[1].speed_bits_per_s == 1e9 and back[6].nics[0].speed_bits_per_s is None
    assert back[6].node_cpu_quota == 0.67 and back[7].node_cpu_quota is None


def test_recordings_from_before_the_cpu_quota_column_read_the_whole_machine(tmp_path):
    path = str(tmp_path / "old.db")
    write(path, one_of_each()[6:8])
    db = sqlite3.connect(path)
    db.execute("ALTER TABLE system DROP COLUMN node_cpu_quota")
    db.commit()
    db.close()
    with Recording.open(path) as rec:
        back = [e for e in rec.events() if isinstance(e, SystemSample)]
    assert [s.node_cpu_quota for s in back] == [None, None] and back[0].node_cpu_percent == 87.25
    event = one_of_each()[6].to_dict()
    event["node_cpu_quota"] = -1
    with pytest.raises(EventDecodeError):
        event_from_dict(event)


def test_nic_speeds_are_typed_at_decoding_and_old_recordings_read_unknown(tmp_path):
    """A NIC list from before the speed fields (13 values) reads speed unknown; a speed that is not a positive
    number, from the file or from the store, is a decoding error, not a share of zero or infinity on screen."""
    path = str(tmp_path / "old.db")
    write(path, one_of_each()[6:7])
    db = sqlite3.connect(path)
    (nics,) = db.execute("SELECT nics FROM system").fetchone()
    old = [n[:13] for n in json.loads(nics)]
    db.execute("UPDATE system SET nics = ?", (json.dumps(old),))
    db.commit()
    with Recording.open(path) as rec:
        (back,) = [e for e in rec.events() if isinstance(e, SystemSample)]
    assert [n.speed_bits_per_s for n in back.nics] == [None, None] and back.nics[1].rx_bytes == 1 << 40
    for bad in (0, -1e9, "1e9"):
        row = json.loads(nics)
        row[1][13] = bad
        with pytest.raises(EventDecodeError):
            schema.decode_system((0, "h", T0, 1.0, 1.0, 1, 1, 1, "eth0", json.dumps(row), "[]", "ok", None))
        event = one_of_each()[6].to_dict()
        event["nics"][1]["speed_bits_per_s"] = bad
        with pytest.raises(EventDecodeError):
            event_from_dict(event)


def test_a_real_job_round_trips(recording, job_events):
    with Recording.open(recording) as rec:
        back = list(rec.events())
        assert back == job_events
        assert rec.complete and rec.first_step == 0 and rec.last_step == 7 and rec.world_size == 2


def test_metadata_names_hosts_model_segments_and_buckets(recording, job_events):
    with Recording.open(recording) as rec:
        meta = rec.meta
        joined = [e for e in job_events if isinstance(e, RankJoined)]
        assert meta["hosts"] == sorted({e.host for e in joined})
        assert set(meta["ranks"]) == {"0", "1"} and meta["ranks"]["0"]["backend"] == "gloo"
        started = next(e for e in job_events if isinstance(e, RunStarted))
        assert meta["model"]["layers"] == [list(x) for x in started.layers]
        assert meta["versions"]["ddptop"] and meta["argv"] == ["ddptop", "test"]
        (segment,) = rec.segments()
        assert segment["index"] == 0 and segment["step"] == 0 and segment["config"]["strategy"] == "ddp"
        assert segment["buckets"] and all(name.startswith("bucket ") and n > 0 for name, n in segment["buckets"])
        assert sum(n for _, n in segment["buckets"]) == started.param_bytes


def test_queries_by_step_and_time(recording):
    with Recording.open(recording) as rec:
        window = list(rec.step_events(2, 5))
        assert sorted({d.step for d in window}) == [2, 3, 4] and {d.rank for d in window} == {0, 1}
        assert all(s.step % 2 == 1 for s in rec.step_events(table="spans"))  # a segment's first is never sampled
        done = rec.time_of_step(3)
        assert rec.step_at_time(done) >= 3
        assert rec.between(rec.start - 1, rec.end) == list(rec.events())


def test_a_reader_sees_batches_while_the_writer_runs(tmp_path):
    """Committed while it is written (a commit every 0.5 s; the interval is not timed here): a second process may
    read a recording that is still being written."""
    path = str(tmp_path / "live.db")
    writer = RecordingWriter(path, base_meta({}, {}))
    try:
        writer.handle([StepDone(0, i, 0, 0, T0 + i, 0.1, 0, 0, 0, 0, 0, 1, 1.0, 0, 0, 0, False) for i in range(50)])
        deadline = time.monotonic() + 30  # the next commit, ~0.5 s away; a loaded machine may run it late
        while True:
            with Recording.open(path) as rec:
                count, complete = rec.count("steps"), rec.complete
            if count == 50 or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert count == 50 and not complete, (count, complete)
    finally:
        writer.close()
    assert Recording.open(path).complete


def test_an_existing_file_is_never_overwritten(tmp_path, recording):
    other = tmp_path / "notes.txt"
    other.write_text("precious")
    with pytest.raises(RecordingError, match="already exists \\(not a ddptop recording\\)"):
        RecordingWriter(str(other), {})
    assert other.read_text() == "precious"
    with pytest.raises(RecordingError, match="already exists \\(a ddptop recording\\): remove it"):
        RecordingWriter(recording, {})
    with pytest.raises(RecordingError, match="no folder"):
        RecordingWriter(str(tmp_path / "missing" / "x.db"), {})


def test_a_finished_recording_is_one_file_readable_by_plain_sqlite(recording):
    assert not os.path.exists(recording + "-wal")
    db = sqlite3.connect(recording)
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
    ranks = db.execute("SELECT rank, count(*) FROM steps GROUP BY rank").fetchall()
    assert ranks == [(0, 8), (1, 8)]
    db.close()


def test_the_record_package_never_imports_torch_or_textual():
    import subprocess
    import sys

    code = ("import sys; import ddptop.cli.recordings, ddptop.record.replay, ddptop.record.export, "
            "ddptop.record.sqlite, ddptop.record.info; "
            "print(sorted(m for m in ('torch', 'textual') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_lab_recordings_from_before_nic_speeds_replay_the_job_interfaces_rate_from_meta_link(tmp_path, monkeypatch):
    """The lab's rate is in meta.link (read back here with plain SQL); the job's interface gets it on replay, the
    others stay unknown, and a recording without meta.link stays unknown."""
    monkeypatch.setenv("DDPTOP_LAB_LINK_BITS", "1e8")
    path = str(tmp_path / "lab.db")
    write(path, one_of_each()[6:7])  # its job interface eth0 carries no speed, as before NICs had one
    (meta,) = sqlite3.connect(path).execute("SELECT value FROM meta WHERE key = 'link'").fetchone()
    with Recording.open(path) as rec:
        (sample,) = [e for e in rec.events() if isinstance(e, SystemSample)]
    eth0, veth0 = sample.nics
    assert eth0.speed_bits_per_s == json.loads(meta)["bits_per_s"] == 1e8 and eth0.speed_by == "shaped by ddptop lab"
    assert veth0.speed_bits_per_s == 1e9  # carried its own
    monkeypatch.delenv("DDPTOP_LAB_LINK_BITS")
    write(str(tmp_path / "plain.db"), one_of_each()[6:7])
    with Recording.open(str(tmp_path / "plain.db")) as rec:
        (sample,) = [e for e in rec.events() if isinstance(e, SystemSample)]
    assert sample.nics[0].speed_bits_per_s is None


def test_recordings_from_before_the_tokens_column_read_no_token_count(tmp_path):
    """StepDone.tokens (issue 44) was added last: a file without the column reads 0 (no count), the rest unchanged."""
    events = one_of_each()
    steps = [e for e in events if isinstance(e, StepDone)]
    steps[0] = dataclasses.replace(steps[0], tokens=1234)  # a batch that said its tokens
    path = str(tmp_path / "old.db")
    write(path, steps)
    db = sqlite3.connect(path)
    assert db.execute("SELECT tokens FROM steps").fetchall() == [(1234,)] + [(0,)] * (len(steps) - 1)
    db.execute("ALTER TABLE steps DROP COLUMN tokens")
    db.commit()
    db.close()
    with Recording.open(path) as rec:
        back = [e for e in rec.events() if isinstance(e, StepDone)]
    assert [s.tokens for s in back] == [0] * len(steps)
    assert as_json([dataclasses.replace(s, tokens=0) for s in back]) == as_json(
        [dataclasses.replace(s, tokens=0) for s in steps])
