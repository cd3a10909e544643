"""A compromised rank (it holds the ranks' key) sends events of the wrong types straight to the front with its own
socket; the front's real pipeline (Collector, Feed, SessionState, RecordingWriter, headless
printer) refuses each of them alone, counts them, keeps every good event and leaves a recording `info` reads."""

from __future__ import annotations

import io
import json
import math
import sqlite3
import subprocess
import sys
import time

import pytest

from ddptop.control.bus import TEL, Publisher
from ddptop.control.keys import MAX_BATCH_BYTES
from ddptop.events import MAX_TEXT, STEP_RECORD, EventsRefused, RankJoined, StepDone, step_block
from ddptop.front.feed import Feed
from ddptop.front.headless import HeadlessPrinter
from ddptop.record.reader import Recording
from ddptop.record.sqlite import RecordingWriter, base_meta
from jobchannel import Served, job_keys

JOB = job_keys("event-types-token", "ef" * 16)


def step(rank: int, n: int, **changes) -> dict:
    good = StepDone(rank, n, 0, 0, time.time(), 0.1, 0.0, 0.05, 0.01, 0.0, 0.0, 16, 2.3, 0, 0, 0, False)
    return {**good.to_dict(), **changes}


HOSTILE = [  # one of each way a field can be wrong, each inside rank 1's own batch
    step(1, 100, iter_s="x"),  # once: the reducer raised on it and the step's text went into a REAL column
    step(1, 101, loss={"a": 1}),  # once: sqlite3 refused the dict and the writer took it for a failed disk
    step(1, 102, comm_bytes=1 << 64),  # past SQLite's INTEGER: the same
    step(1, 103, step=-3),
    step(1, 104, sampled="yes"),
    step(1, 105, t=math.inf),
    step(1, 106, batch_size=True),
    step(0, 107),  # rank 1 speaking for rank 0
    {**RankJoined(1, 2, "h", 1, "cpu", "gloo", 1, "2", "0", "local", time.time()).to_dict(), "host": 5},
    {"kind": "step_spans", "v": 1, "rank": 1, "step": 1, "segment": 0, "t0": time.time(),
     "spans": [["fwd", "a", "0.0", 0.1, 0, 0, 0]]},
    {"kind": "config_applied", "v": 1, "rank": 1, "step": 0, "segment": 0, "request_id": 0, "who": "x",
     "t": time.time(), "config": {"strategy": "ddp", "bucket_mb": "25"}},
    {"kind": "log", "v": 1, "rank": 1, "level": "error", "message": "x" * (MAX_TEXT + 1), "t": time.time()},
]


@pytest.fixture
def port():
    job = Served(JOB, world_size=2)
    yield job
    job.close()


def compromised_rank_writes(served: Served, rank: int, seq: int, items: list) -> None:
    """What a rank holding the key can send: a batch in its own name, by its own socket."""
    raw = served.rank_socket()
    body = json.dumps(items).encode()  # json writes inf as Infinity, as a rank's json.dumps would
    raw.send_multipart([TEL, str(rank).encode(), str(seq).encode(), body])
    raw.close(linger=2000)


def run_front(port: Served, path: str) -> tuple[Feed, HeadlessPrinter, RecordingWriter]:
    publisher = Publisher(port.rank_socket(), 0, interval_s=3600)  # rank 0: honest, flushed by hand
    for n in range(3):
        publisher.emit(StepDone(**{k: v for k, v in step(0, n).items() if k not in ("kind", "v")}))
    publisher.flush()
    good = [step(1, n) for n in range(3)]
    compromised_rank_writes(port, 1, 1, good[:1] + HOSTILE[:6] + good[1:2] + HOSTILE[6:] + good[2:])
    printer = HeadlessPrinter(out=io.StringIO(), bar=False)
    writer = RecordingWriter(path, base_meta({"model": "tiny"}, {"source": "local", "world_size": 2}))
    feed = Feed(port.hub.source, [writer], state=printer.state)
    state, deadline = printer.state.state, time.monotonic() + 10
    while min(len(state.history.get(r, ())) for r in (0, 1)) < 3 and time.monotonic() < deadline:
        feed.pump()
        time.sleep(0.05)
    feed.stop()
    writer.close()
    printer.finish(traffic=False)
    publisher.close()
    return feed, printer, writer


def test_hostile_field_types_are_refused_counted_and_the_recording_stays_readable(port, tmp_path):
    path = str(tmp_path / "hostile.db")
    feed, printer, writer = run_front(port, path)
    assert feed.error is None and writer.error is None  # no sink raised, the recorder never thought the disk failed
    assert printer.state.state.refused == len(HOSTILE)
    assert [d.step for d in printer.state.state.history[1]] == [0, 1, 2]  # rank 1's good events were applied
    lines = printer.out.getvalue().splitlines()
    said = [line for line in lines if "refused" in line]
    assert len(said) == 2, lines  # once when it happens, once with the count at the end
    assert said[0].startswith(f"rank 1: refused {len(HOSTILE)} events") and "iter_s" in said[0]
    assert said[1].startswith(f"refused {len(HOSTILE)} events from the ranks in all")

    db = sqlite3.connect(path)
    steps = db.execute("SELECT rank, step, typeof(iter_s), typeof(loss), typeof(comm_bytes) FROM steps "
                       "ORDER BY rank, step").fetchall()
    assert steps == [(r, n, "real", "real", "integer") for r in (0, 1) for n in range(3)]  # every good step, no other
    refused = db.execute("SELECT rank, json_extract(data, '$.count') FROM events WHERE kind = 'events_refused'")
    assert refused.fetchall() == [(1, len(HOSTILE))]
    assert db.execute("SELECT count(*) FROM events WHERE kind != 'events_refused'").fetchone() == (0,)
    assert db.execute("SELECT count(*) FROM spans").fetchone() == (0,)
    db.close()

    info = subprocess.run([sys.executable, "-m", "ddptop", "info", path], capture_output=True, text=True, timeout=60)
    assert info.returncode == 0, info.stderr
    assert f"{len(HOSTILE)} events refused while recording" in info.stdout
    with Recording.open(path) as rec:
        events = list(rec.events())
    assert sum(isinstance(e, StepDone) for e in events) == 6
    assert [e.count for e in events if isinstance(e, EventsRefused)] == [len(HOSTILE)]


def test_hostile_binary_step_records_are_refused_alone_and_a_block_that_is_no_block_costs_its_batch(port, tmp_path):
    """The same rank, with StepDone's binary form (events.step_block, issue 42): values no typed field holds, a
    record in another rank's name, a truncated block and a block over the batch's cap."""
    def record(n: int, **raw) -> bytes:
        event = StepDone(**{k: v for k, v in step(1, n).items() if k not in ("kind", "v")})
        return STEP_RECORD.pack(*(raw.get(name, value) for name, value in event.__dict__.items()))

    good = [record(n) for n in range(3)]
    hostile = [record(10, t=math.inf), record(11, comm_bytes=1 << 63), record(12, sampled=2),
               record(13, iter_s=math.nan), record(14, rank=0)]
    raw = port.rank_socket()
    raw.send_multipart([TEL, b"1", b"1", b"[8]",
                        step_block(good[:1] + hostile[:3] + good[1:2] + hostile[3:] + good[2:])])
    raw.send_multipart([TEL, b"1", b"2", b"[3]", step_block(good)[:-1]])  # truncated: the whole batch is refused
    many = MAX_BATCH_BYTES // len(good[0]) + 1
    raw.send_multipart([TEL, b"1", b"3", b"[%d]" % many, step_block([good[0]] * many)])
    raw.close(linger=2000)
    path = str(tmp_path / "hostile-records.db")
    writer = RecordingWriter(path, base_meta({"model": "tiny"}, {"source": "local", "world_size": 2}))
    printer = HeadlessPrinter(out=io.StringIO(), bar=False)
    feed = Feed(port.hub.source, [writer], state=printer.state)
    deadline = time.monotonic() + 10
    while port.hub.collector.batches < 3 and time.monotonic() < deadline:
        feed.pump()
        time.sleep(0.05)
    feed.pump()
    feed.stop()
    writer.close()
    assert feed.error is None and writer.error is None
    assert [d.step for d in printer.state.state.history[1]] == [0, 1, 2]
    assert printer.state.state.refused == len(hostile)
    db = sqlite3.connect(path)
    assert db.execute("SELECT rank, step, typeof(iter_s), typeof(comm_bytes) FROM steps ORDER BY step").fetchall() \
        == [(1, n, "real", "integer") for n in range(3)]
    gaps = db.execute("SELECT json_extract(data, '$.first_seq'), json_extract(data, '$.reason') FROM events "
                      "WHERE kind = 'telemetry_gap' ORDER BY 1").fetchall()
    assert [g[0] for g in gaps] == [2, 3] and "not a whole number" in gaps[0][1] and "over the" in gaps[1][1]
    db.close()
    info = subprocess.run([sys.executable, "-m", "ddptop", "info", path], capture_output=True, text=True, timeout=60)
    assert info.returncode == 0, info.stderr
