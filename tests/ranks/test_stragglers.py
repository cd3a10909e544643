"""Stragglers on 2 real gloo ranks: a test-only hook (DDPTOP_TEST_RANK) makes rank 1 arrive 40 ms late at every
collective and sets its wall clock 5 s behind. Rank 0's clock ping-pong recovers the offset within the ±rtt/2 it
states, and the recording names rank 1 with that delay, where its own clock would have it arrive first, 5 s early.
Timing bounds: the alone phase (2 ranks on the 2-core CI machine, not 3: 3 left one rank's backward tens of ms
behind now and then, which is a straggler too)."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys

import pytest

from ddptop.cli import main
from ddptop.metrics.stragglers import analyse
from ddptop.record.info import stragglers
from ddptop.record.reader import Recording

pytestmark = pytest.mark.alone

DELAY_S, OFFSET_S = 0.040, -5.0
# allreduce: 12 blocking collectives a step, each one met 40 ms late; ddp: the tiny model's one bucket, late by the
# same 40 ms (the hook sleeps in the comm hook at the end of backward). 1 + 8 steps each, every step after a
# segment's first sampled: 96 + 8 collectives.
PROFILE = """
[run]
model = "tiny"
batch_size = 16
synthetic_size = 960
span_every = 1

[sweep]
warmup = 1
measure = 8
configs = [{ strategy = "allreduce" }, { strategy = "ddp", bucket_mb = 25 }]
"""


@pytest.fixture(scope="module")
def recording(tmp_path_factory):
    folder = tmp_path_factory.mktemp("straggler")
    (folder / "straggle.toml").write_text(PROFILE)
    record = folder / "straggle.db"
    env = {**os.environ, "DDPTOP_TEST_RANK": f"straggle=1:{DELAY_S * 1000:g},clock=1:{OFFSET_S:g}"}
    run = subprocess.run([sys.executable, "-m", "ddptop", "--headless", "--local", "2", "--profile",
                          str(folder / "straggle.toml"), "--no-eval", "--record", str(record)],
                         env=env, capture_output=True, text=True, timeout=180)
    assert run.returncode == 0, run.stderr
    return record


def test_the_ping_pong_recovers_each_clock_offset_within_its_stated_uncertainty(recording):
    """Ground truth: the hook's offset (rank 1's clock reads time.time() − 5 s)."""
    rows = [json.loads(d) for (d,) in sqlite3.connect(recording).execute(
        "SELECT data FROM events WHERE kind = 'clock_sync' ORDER BY seq")]
    assert [r["at"] for r in rows] == ["start", "end"]
    for row in rows:
        peers = {rank: (offset, rtt) for rank, offset, rtt in row["peers"]}
        assert set(peers) == {0, 1} and peers[0] == (0.0, 0.0)
        offset, rtt = peers[1]
        assert 0 < rtt < 0.05  # a bound worth stating: loopback round trips take ~0.2 ms
        assert abs(offset - OFFSET_S) <= rtt / 2 + 1e-6  # the 1 µs: float rounding of 1.8e9 s


def test_the_straggler_is_named_with_the_injected_delay(recording, capsys):
    assert main(["info", str(recording)]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("stragglers"))
    assert line.startswith("stragglers rank 1 arrived last at ") and " of 104 collectives, " in line
    with Recording.open(str(recording)) as rec:
        verdicts = stragglers(rec)
    for segment in (0, 1):  # allreduce, ddp
        verdict = verdicts[segment]
        assert verdict.rank == 1, verdict.describe()
        assert verdict.late_s == pytest.approx(DELAY_S, rel=0.2), verdict.describe()
        # rank 0 waited for rank 1; rank 1 itself waited for nobody
        assert verdict.waiting_s[1] < 0.2 * DELAY_S < 0.8 * DELAY_S < verdict.waiting_s[0]


def test_without_the_clocks_rank_0_would_seem_5_s_late(recording):
    """What the alignment is for: read on the ranks' own clocks, rank 1 arrives 5 s early and rank 0 is named."""
    with Recording.open(str(recording)) as rec:
        unaligned = analyse(rec.step_events(table="spans"), [], rec.world_size)[None]
    assert unaligned.rank == 0 and unaligned.late_s == pytest.approx(-OFFSET_S, abs=0.5)
