"""The recording's clock (`at`) is when the front received each batch, never a rank's: a rank whose clock runs an
hour ahead shifts neither the other rank's rows nor the replay's duration, and keeps its own times in `t`."""

from __future__ import annotations

import re
import sqlite3
import subprocess
import sys
import time

import pytest

from calibrate import slowdown

from ddptop.control.bus import Publisher
from ddptop.events import StepDone
from ddptop.front.feed import Feed
from ddptop.record.reader import Recording
from ddptop.record.replay import ReplaySource
from ddptop.record.sqlite import RecordingWriter, base_meta
from jobchannel import Served, job_keys

JOB = job_keys("clock-token", "a1" * 16)
AHEAD_S = 3600.0
STEPS, EVERY_S = 8, 0.15  # 8 steps about 1.2 s apart in all


@pytest.fixture(scope="module")
def path(tmp_path_factory) -> str:
    """A 2-rank job recorded live through the front's pipeline; rank 1's wall clock is an hour ahead."""
    served = Served(JOB, world_size=2)
    ranks = [Publisher(served.rank_socket(), r, interval_s=3600) for r in (0, 1)]  # flushed by hand, once per step
    path = str(tmp_path_factory.mktemp("clock") / "clock.db")
    writer = RecordingWriter(path, base_meta({"model": "tiny"}, {"source": "local", "world_size": 2}))
    feed = Feed(served.hub.source, [writer])
    for n in range(STEPS):
        for rank in (0, 1):  # under a running maximum rank 1's first step would drag every later row an hour on
            t = time.time() + (AHEAD_S if rank == 1 else 0.0)
            ranks[rank].emit(StepDone(rank, n, 0, 0, t, 0.1, 0.0, 0.05, 0.01, 0.0, 0.0, 16, 2.3, 0, 0, 0, False))
            ranks[rank].flush()
        time.sleep(EVERY_S)
        feed.pump()
    feed.stop()
    writer.close()
    for publisher in ranks:
        publisher.close()
    served.close()
    return path


def test_a_skewed_rank_shifts_neither_the_other_ranks_rows_nor_its_own(path):
    db = sqlite3.connect(path)
    rows = db.execute("SELECT rank, step, at, t FROM steps ORDER BY seq").fetchall()
    db.close()
    assert sorted((r, n) for r, n, _, _ in rows) == [(r, n) for r in (0, 1) for n in range(STEPS)]
    within = 5 * slowdown()  # received within seconds of when the step ended, on this machine (calibrate.py)
    for rank, _, at, t in rows:
        ahead = AHEAD_S if rank == 1 else 0.0
        assert abs(at - (t - ahead)) < within, (rank, at, t)
    ats = [at for *_, at, _ in rows]
    assert ats == sorted(ats)  # the playback clock never goes backwards
    assert STEPS * EVERY_S * 0.5 < ats[-1] - ats[0] < 10 * slowdown()


def test_replay_and_info_last_as_long_as_the_run(path):
    with Recording.open(path) as rec:
        assert STEPS * EVERY_S * 0.5 < rec.duration < 10 * slowdown()
    source = ReplaySource(path, playing=False)
    assert source.t_end < 10 and source.recording.step_at_time(source.recording.start + source.t_end) == STEPS - 1
    source.close()
    info = subprocess.run([sys.executable, "-m", "ddptop", "info", path], capture_output=True, text=True, timeout=60)
    assert info.returncode == 0, info.stderr
    when = re.search(r"^when .* for (\d+) s, steps 0-7$", info.stdout, re.M)  # not "for 1 h 00 min"
    assert when and int(when.group(1)) < 10, info.stdout
