"""Issue 27's generic attack: a stranger with only host:port lists the store's keys (torch >= 2.x answers anyone),
freezes every listed key to its first value and deletes every new key, for 20 s, without the token. The job
must notice nothing: no rank lost, no telemetry gap, every step of both ranks recorded, a `ctl set` applied."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import threading
import time
from datetime import timedelta

import torch.distributed as dist

from security_job import Job
from ddptop.events import ConfigApplied, RankLost, StepDone, TelemetryGap
from ddptop.record.reader import Recording
from test_run_cli import DDPTOP

ATTACK_S = 20.0


def freeze_and_delete(port: int, stop: threading.Event, done: dict) -> None:
    """Every listed key back to its first value, every new key deleted, as fast as the store answers."""
    raw = dist.TCPStore("127.0.0.1", port, None, False, timedelta(seconds=10))
    first = {key: raw.get(key) for key in raw.list_keys()}
    done["listed"] = len(first)
    while not stop.is_set():
        for key in raw.list_keys():
            if key not in first:
                raw.delete_key(key)
                done["deleted"] = done.get("deleted", 0) + 1
        for key, value in first.items():
            raw.set(key, value)
        done["rounds"] = done.get("rounds", 0) + 1


def test_a_stranger_freezing_and_deleting_every_key_changes_nothing(tmp_path):
    before = os.environ.get("DDPTOP_STATE_DIR")
    job = Job(tmp_path)
    try:
        # Job looks for its job file in its own state folder; the tests after this one on this pytest worker keep
        # the environment they had (it once stayed set for the rest of the worker)
        assert os.environ.get("DDPTOP_STATE_DIR") == before, (os.environ.get("DDPTOP_STATE_DIR"), before)
        stop, done = threading.Event(), {}
        attacker = threading.Thread(target=freeze_and_delete, args=(job.port, stop, done), daemon=True)
        attacker.start()
        started = time.monotonic()
        time.sleep(3)
        ctl = subprocess.run(DDPTOP + ["ctl", "--port", str(job.port), "set", "strategy=allreduce"],
                             capture_output=True, text=True, timeout=60, env=job.env)
        time.sleep(max(0.0, ATTACK_S - (time.monotonic() - started)))
        stop.set()
        attacker.join(timeout=10)
        assert done.get("listed", 0) > 0 and done.get("rounds", 0) > 10, done  # the attack ran, on every key
        assert ctl.returncode == 0 and "applied" in ctl.stdout, ctl.stdout + ctl.stderr
        out, err, _ = job.stop(signal.SIGTERM)
    finally:
        if job.proc.poll() is None:
            job.stop(signal.SIGKILL)
    assert job.proc.returncode == 0, err
    assert "lost" not in out and "missing" not in out and "Traceback" not in err, out + err
    with Recording.open(str(job.record)) as rec:
        events = list(rec.events())
        assert rec.complete
    assert not [e for e in events if isinstance(e, (RankLost, TelemetryGap))]
    for rank in (0, 1):  # every step of both ranks, once and in order, through the whole attack
        steps = [e.step for e in events if isinstance(e, StepDone) and e.rank == rank]
        assert steps == list(range(len(steps))) and len(steps) > 50, steps[-5:]
    switches = [e for e in events if isinstance(e, ConfigApplied) and e.who.startswith("ctl@")]
    assert {e.rank for e in switches} == {0, 1} and {e.config["strategy"] for e in switches} == {"allreduce"}
    db = sqlite3.connect(job.record)  # the same, by SQL on the file: as many steps per rank as rank 0's last + 1
    counts = db.execute("SELECT rank, count(*), max(step) FROM steps GROUP BY rank").fetchall()
    db.close()
    assert len(counts) == 2 and all(n == last + 1 for _, n, last in counts), counts
    info = subprocess.run(DDPTOP + ["info", str(job.record)], capture_output=True, text=True, timeout=60)
    assert info.returncode == 0 and "complete)" in info.stdout and "0 ranks lost" in info.stdout, info.stdout
