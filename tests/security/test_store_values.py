"""Every value ddptop reads from the job's channel is checked before use, on a real channel served as a job serves it.

These write bad values where ddptop really reads them (the job's channel), i.e. what a channel written by someone
holding the token or the ranks' key would hold: ddptop must refuse each in one line or one event, quickly, and
keep going.
"""

from __future__ import annotations

import json
import time

import pytest

from ddptop.control import keys
from ddptop.control.auth import seal
from ddptop.control.bus import Collector, Liveness, Publisher
from ddptop.control.client import ControlClient, ControlError
from ddptop.control.commands import Replays, make_request, read_request, seal_json
from ddptop.events import RankBack, RankLost, StepDone, StepSpans, Span, TelemetryGap
from jobchannel import Served, job_keys

TOKEN = "store-values-token"
JOB = job_keys(TOKEN, "ab" * 16)


@pytest.fixture(scope="module")
def served():
    job = Served(JOB)
    yield job
    job.close()


def view(served: Served):
    return served.client()


def status(**changes) -> dict:
    return {"step": 5, "segment": 0, "world_size": 2, "paused": False, "t": time.time(), "job": JOB.job_id,
            "config": {"strategy": "ddp", "bucket_mb": 25.0, "async_op": False, "batch_size": 16, "lr": 0.1},
            **changes}


@pytest.mark.alone  # a bound on time: run after the rest, one at a time
@pytest.mark.parametrize("value, words", [
    (b"{not json", "not signed"),
    (seal(b"another-token-here", "status", json.dumps(status()).encode()), "bad MAC"),
    (seal_json(JOB.control, "status", status(world_size=100000000)), "world_size is not a whole number in 1..65536"),
    (seal_json(JOB.control, "status", status(step="many")), "step is not a whole number"),
    (seal_json(JOB.control, "status", status(config={"strategy": "ring"})), "config: unknown strategy"),
    (seal(JOB.control, "status", b"[" * 3000), "not JSON"),
    (b"x" * (1 << 20), "over the 16384-byte cap"),
], ids=["not-json", "other-token", "world-size", "step", "strategy", "deep-json", "huge"])
def test_a_status_that_does_not_check_out_is_one_line_quickly(served, value, words, monkeypatch):
    monkeypatch.setattr("ddptop.control.client.STATUS_WAIT_S", 0.3)  # the retry is timed once, below
    view(served).set(keys.STATUS, value)
    start = time.monotonic()
    with pytest.raises(ControlError) as caught:
        ControlClient("127.0.0.1", served.port, TOKEN).status()
    assert time.monotonic() - start < 2
    assert words in str(caught.value) and "\n" not in str(caught.value)


@pytest.mark.alone  # a bound on time: run after the rest, one at a time
def test_a_bad_status_is_retried_for_two_seconds_then_given_up(served):
    view(served).set(keys.STATUS, b"{not json")
    start = time.monotonic()
    with pytest.raises(ControlError, match="refused"):
        ControlClient("127.0.0.1", served.port, TOKEN).status()
    assert 2 <= time.monotonic() - start < 4  # rank 0 rewrites its status twice a second: a real one would win


def test_a_good_status_is_read_and_heartbeats_are_checked(served):
    store = view(served)
    store.set(keys.STATUS, seal_json(JOB.control, "status", status()))
    store.set(keys.heartbeat(0), seal_json(JOB.ranks, f"hb {JOB.job_id} 0", {"step": 7, "beat": 1, "paused": False}))
    store.set(keys.heartbeat(1), seal_json(JOB.ranks, f"hb {JOB.job_id} 0", {"step": 9, "beat": 1, "paused": False}))
    got = ControlClient("127.0.0.1", served.port, TOKEN).status()
    assert got["ranks"][0] == {"rank": 0, "step": 7}
    assert "bad MAC" in got["ranks"][1]["refused"]  # rank 0's heartbeat copied to rank 1's key


def step(rank: int, n: int) -> StepDone:
    return StepDone(rank, n, 0, 0, time.time(), 0.1, 0.0, 0.05, 0.01, 0.0, 0.0, 16, 2.3, 0, 0, 0, False)


@pytest.mark.alone  # a bound on time: run after the rest, one at a time
def test_lost_or_altered_telemetry_is_a_gap_and_the_rest_still_arrives(served):
    publisher = Publisher(view(served), 0, JOB, interval_s=3600)  # flushed by hand: one batch per step
    collector = Collector(view(served), 1, JOB)
    store = view(served)
    for n in range(10):
        publisher.emit(step(0, n))
        publisher.flush()
    store.delete_key(keys.tel_batch(0, 3))  # batch 3 (step 2) gone
    store.set(keys.tel_batch(0, 5), seal(b"not-the-ranks-key", f"tel {JOB.job_id} 0 5", b"[]"))  # batch 5 forged
    events = collector.poll()
    assert [e.step for e in events if isinstance(e, StepDone)] == [0, 1, 3, 5, 6, 7, 8, 9]
    gaps = [(e.first_seq, e.reason) for e in events if isinstance(e, TelemetryGap)]
    assert gaps[0] == (3, "missing from the store") and gaps[1][0] == 5 and "bad MAC" in gaps[1][1]
    store.set(keys.tel_head(0), b"1000000")  # a head that is not the rank's: the collector looks for the batch itself
    publisher.emit(step(0, 10))
    publisher.flush()
    store.set(keys.tel_head(0), b"1000000")
    start = time.monotonic()
    assert [e.step for e in collector.poll() if isinstance(e, StepDone)] == [10]
    assert time.monotonic() - start < 1  # never a multi_get of a key that is not there (the store's 60 s timeout)
    publisher.close()


def test_a_batch_never_exceeds_the_cap_the_store_accepts(served):
    publisher = Publisher(view(served), 1, JOB, interval_s=3600)
    collector = Collector(view(served), 2, JOB)
    spans = tuple(Span("bwd", f"features.{i}" * 20, 0.0, 0.001) for i in range(1500))  # ~100 KB each
    for n in range(50):
        publisher.emit(StepSpans(1, n, 0, time.time(), spans))
    publisher.flush()
    assert publisher.seq >= 2  # 5 MB of events: split under keys.MAX_BATCH_BYTES (the server drops > 8 MiB)
    got, deadline = [], time.monotonic() + 60
    while len(got) < 50:
        assert time.monotonic() < deadline, f"60 s after the flush the collector had steps {got} of 0-49: the rest lost"
        new = [e.step for e in collector.poll() if isinstance(e, StepSpans)]
        got += new
        if not new:
            time.sleep(0.05)
    assert got == list(range(50))
    publisher.close()


def test_a_rank_that_goes_silent_is_lost_and_one_that_comes_back_is_back(served):
    store = view(served)
    liveness = Liveness(view(served), 3, JOB, lost_after_s=0.3)

    def beat(rank: int, n: int, key: bytes = JOB.ranks) -> None:
        store.set(keys.heartbeat(rank), seal_json(key, f"hb {JOB.job_id} {rank}", {"step": n, "beat": n}))

    def rank2() -> list:  # ranks 0 and 1 hold an earlier test's heartbeats
        return [e for e in liveness.check() if e.rank == 2]

    beat(2, 1)
    assert rank2() == []
    time.sleep(0.4)
    beat(2, 2, key=b"a-stranger-guessing")
    lost = rank2()
    assert len(lost) == 1 and isinstance(lost[0], RankLost) and lost[0].rank == 2 and lost[0].last_step == 1
    assert "the newest was refused: bad MAC" in lost[0].reason
    beat(2, 3)
    back = rank2()
    assert len(back) == 1 and isinstance(back[0], RankBack) and back[0].step == 3 and back[0].silent_s >= 0.3


def request(request_id: int = 7, **body) -> bytes:
    raw = make_request(JOB, request_id, "pause", None, "tester")
    if not body:
        return raw
    data = {**json.loads(raw.split(b"\n", 1)[1]), **body}
    return seal(JOB.control, f"req {JOB.job_id} {request_id}", json.dumps(data).encode())


@pytest.mark.parametrize("raw, request_id, words", [
    (request(7), 8, "bad MAC"),  # moved to another id
    # built when pytest collects, which can be many minutes before the test runs: offsets far past that gap
    (request(7, t=time.time() - 86400), 7, "outside ±60 s"),
    (request(7, t=time.time() + 86400), 7, "outside ±60 s"),
    (request(7, job="cd" * 16), 7, "another job"),
    (request(7, op="reboot"), 7, "malformed"),
    (request(7, t=float("nan")), 7, "malformed"),
    (seal(JOB.control, f"req {JOB.job_id} 7", b"[" * 4000), 7, "not JSON"),
    (b"0" * 64 + b"\n{}", 7, "bad MAC"),
    (b"x" * 100000, 7, "cap"),
], ids=["other-id", "stale", "future", "other-job", "bad-op", "nan-time", "deep-json", "zero-mac", "huge"])
def test_a_request_is_refused_unless_fresh_signed_for_this_job_and_id(raw, request_id, words):
    with pytest.raises(ValueError, match=words):
        read_request(JOB, request_id, raw, Replays())


def test_a_request_is_accepted_once():
    replays = Replays()
    raw = request(9)
    assert read_request(JOB, 9, raw, replays)["op"] == "pause"
    with pytest.raises(ValueError, match="already accepted once"):
        read_request(JOB, 9, raw, replays)
