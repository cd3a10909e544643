"""The recording's `memory` table (issue 43): a real job's memory samples come back from it exactly, replay's history
after a seek holds the segment in force's, and a file from before the table (the same recording with the table
dropped by sqlite3) still opens and reads alike, holding no memory samples, for info, replay and the report's load."""

from __future__ import annotations

import json
import shutil
import sqlite3

from ddptop.events import MemorySample
from ddptop.metrics.memory import memory_table
from ddptop.record import info
from ddptop.record.reader import Recording
from ddptop.record.sqlite import RecordingWriter, base_meta
from ddptop.report.runs import load


def _json(events) -> list[str]:
    return [json.dumps(e.to_dict()) for e in events]


def test_a_real_jobs_memory_samples_round_trip_through_their_table(recording, job_events):
    sent = [e for e in job_events if isinstance(e, MemorySample)]
    assert {(e.rank, e.step) for e in sent} >= {(0, 0), (1, 0)}  # each rank's segment starts with one
    with sqlite3.connect(recording) as db:
        rows = db.execute("SELECT rank, step, param_bytes, grad_bytes, optim_bytes, by FROM memory ORDER BY seq")
        assert [(e.rank, e.step, e.param_bytes, e.grad_bytes, e.optim_bytes, e.by) for e in sent] == rows.fetchall()
    with Recording.open(recording) as rec:
        assert _json(rec.memory_events()) == _json(sent)
        assert _json(e for e in rec.events() if isinstance(e, MemorySample)) == _json(sent)
        history = rec.history(rec.end)
        last = [e for e in sent if e.segment == max(s.segment for s in sent)]
        # per rank, its newest sample and the one of its largest peak: what the segment's memory table needs
        kept = {id(max((e for e in last if e.rank == r), key=key)) for r in (0, 1)
                for key in (lambda e: e.t, lambda e: e.peak_bytes)}
        assert _json(e for e in history if isinstance(e, MemorySample)) == _json(e for e in last if id(e) in kept)
        assert rec.count("memory") == len(sent)


def test_a_recording_from_before_the_memory_table_reads_as_holding_no_samples(recording, tmp_path):
    old = str(tmp_path / "old.db")
    shutil.copy(recording, old)
    with sqlite3.connect(old) as db:
        db.execute("DROP TABLE memory")
    with Recording.open(recording) as rec:
        kept = _json(e for e in rec.events() if not isinstance(e, MemorySample))
        before = info.summary(rec)
    with Recording.open(old) as rec:
        assert _json(rec.events()) == kept and list(rec.memory_events()) == []
        assert not [e for e in rec.history(rec.end) if isinstance(e, MemorySample)]
        assert rec.count("memory") == 0
        info.check_all(rec)
        after = info.summary(rec)
    assert after["memory"] == [] and before["memory"]
    assert "memory" not in info.render(after).replace("memory samples", "")
    for key in ("segments", "first_step", "last_step", "finished"):
        assert after[key] == before[key]
    assert load(old).memory == [] and len(load(recording).memory) == len(before["memory"])


def test_after_a_seek_the_history_holds_each_ranks_newest_sample_and_its_largest_peak(tmp_path):
    """A long segment's samples are not all replayed after a seek: per rank its newest and its largest peak's,
    from which the segment's memory table (metrics.memory) is the same as from all of them."""
    samples = [MemorySample(rank, step, 1 if step >= 10 else 0, 1.7e9 + step + rank / 10, 100, 100 * (step > 0), 100,
                            peak, peak, 0, "process USS") for rank in (0, 1)
               for step, peak in ((0, 500), (10, 900), (11, 300), (12, 950 - rank * 100), (13, 400), (14, 350))]
    samples.sort(key=lambda e: e.t)
    path = str(tmp_path / "long.db")
    writer = RecordingWriter(path, base_meta({}, {"source": "local", "world_size": 2}, ["x"]), clock="events")
    writer.handle(samples)
    writer.close()
    with Recording.open(path) as rec:
        history = [e for e in rec.history(rec.end) if isinstance(e, MemorySample)]
    assert sorted((e.rank, e.step) for e in history) == [(0, 12), (0, 14), (1, 10), (1, 14)]
    whole, seek = memory_table(e for e in samples if e.segment == 1), memory_table(history)
    assert [(m.rank, m.param_bytes, m.grad_bytes, m.optim_bytes, m.peak_bytes, m.now_bytes) for m in seek] == \
        [(m.rank, m.param_bytes, m.grad_bytes, m.optim_bytes, m.peak_bytes, m.now_bytes) for m in whole] == \
        [(0, 100, 100, 100, 950, 350), (1, 100, 100, 100, 900, 350)]
