"""The What-if panel's check of a switch, live: a real 2-rank job (tiny model, gloo) switched with `ddptop ctl set`
from another process; the front's own state (what the screen draws) keeps the prediction made from the segment
before and, once the new segment has measured steps, its measurement and the running error. The measurement is
checked against SQL on the job's events written to a recording."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import threading
import time

import pytest

from ddptop.events import StepDone
from ddptop.front.supervisor import run_front
from ddptop.record.sqlite import RecordingWriter, base_meta
from ddptop.rendezvous import Rendezvous
from ddptop.train.worker import WorkerOptions
from jobs import connect, tiny_config
import ports

TOKEN = "test-token-whatif"
STEPS = 15  # steps of each segment before moving on (sampled every 2nd: 7 to fit the model on)


def test_a_ctl_switch_shows_its_prediction_beside_its_measurement_and_the_running_error(tmp_path):
    port, events, snaps, said = ports.port(), [], [], []

    class Collect:  # a sink of the front's pipeline, as the recording is
        def handle(self, batch):
            events.extend(batch)

    def steps(segment: int) -> int:
        return sum(1 for e in list(events) if isinstance(e, StepDone) and e.rank == 0 and e.segment == segment)

    def wait(segment: int) -> None:
        deadline = time.monotonic() + 60
        while steps(segment) < STEPS and time.monotonic() < deadline:
            time.sleep(0.1)

    def script():
        client = connect(port, TOKEN)
        wait(0)
        ctl = [sys.executable, "-m", "ddptop", "ctl", "--master", "127.0.0.1", "--port", str(port), "--token", TOKEN]
        said.append(subprocess.run(ctl + ["set", "bucket_mb=1"], capture_output=True, text=True, timeout=60))
        wait(1)
        client.send("stop")

    def consumer(feed, job):  # the screen's loop: pump, then take the snapshot it would draw
        threading.Thread(target=script, daemon=True).start()
        while job.alive():
            feed.pump()
            snaps.append(feed.snapshot())
            time.sleep(0.1)
        feed.stop()
        snaps.append(feed.snapshot())

    cfg = tiny_config(strategy="ddp", steps=100000, span_every=2)
    rdv = Rendezvous("127.0.0.1", port, 0, 2, 0, 2, "local")
    assert run_front(cfg, rdv, WorkerOptions(timeout_s=60, token=TOKEN), consumer, sinks=[Collect()]) == 0
    assert said and said[0].returncode == 0, said and said[0].stderr

    path = str(tmp_path / "run.db")
    writer = RecordingWriter(path, base_meta({"model": "tiny"}, {"source": "local", "world_size": 2}), clock="events")
    writer.handle(events)
    writer.close()
    with sqlite3.connect(path) as con:  # the slowest rank's mean over segment 1's measured steps (warm-up: 1 step)
        truth = con.execute("""
            SELECT max(mean) FROM (SELECT s.rank, avg(s.iter_s) AS mean FROM steps s JOIN segments g
            ON g.segment = s.segment WHERE s.segment = 1 AND s.sampled = 0 AND s.step >= g.step + 1 GROUP BY s.rank)
            """).fetchone()[0]

    w = snaps[-1].whatif
    assert w.seg is not None and w.rows, w.why  # the table, fitted live
    (check,) = w.checks
    assert (check.segment, check.config, check.from_segment) == (1, "ddp 1 MB", 0)
    assert check.measured_s == pytest.approx(truth, rel=1e-9)
    assert check.predicted_s > 0 and check.error == (check.predicted_s - truth) / truth
    assert w.running == (abs(check.error), abs(check.error))
    # made at the switch, before segment 1 was measured: an early snapshot holds the same prediction, unmeasured
    early = next(s.whatif.checks[0] for s in snaps if s.whatif.checks)
    assert early.predicted_s == check.predicted_s
    print(f"what-if on the screen's thread: at most {max(s.whatif.cost_s for s in snaps) * 1e3:.1f} ms a snapshot")
