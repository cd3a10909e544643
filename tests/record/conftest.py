"""Fixtures for recording tests: one real 2-rank job whose events are recorded once per run."""

from __future__ import annotations

import pytest

from built_once import built_once
from jobs import run_job, tiny_config

from ddptop.events import Event
from ddptop.record.sqlite import RecordingWriter, base_meta


@pytest.fixture(scope="session")
def job_events(tmp_path_factory) -> list[Event]:
    """Every event of a real job: 2 gloo ranks, DDP with two buckets, 8 steps, spans every 2nd step (one job for
    every worker: two test files read it)."""
    return built_once(tmp_path_factory, "job-events", _job_events)


def _job_events(folder) -> list[Event]:
    cfg = tiny_config(strategy="ddp", bucket_mb=0.05, steps=8, span_every=2)
    code, events = run_job(cfg, 2)
    assert code == 0
    return events


@pytest.fixture(scope="session")
def recording(tmp_path_factory, job_events) -> str:
    """A recording of `job_events`, written in collector-sized batches."""
    path = str(tmp_path_factory.mktemp("rec") / "job.db")
    writer = RecordingWriter(path, base_meta({"model": "tiny", "sync": {"strategy": "ddp"}},
                                             {"source": "local", "world_size": 2}, ["ddptop", "test"]),
                             clock="events")  # written after the job: its own times are the only clock
    for i in range(0, len(job_events), 5):
        writer.handle(job_events[i:i + 5])
    writer.close()
    return path
