"""Every value ddptop reads from the front's sockets is checked before use, on a real hub served as a job serves it.

These send bad values where ddptop really reads them, i.e. what someone holding a role's key (the token, or the
ranks key a rank started without the token holds) could send: ddptop must refuse each in one line or one event,
quickly, and keep going.
"""

from __future__ import annotations

import json
import time

import pytest

from calibrate import Calibrated

from ddptop.control.bus import BEAT, TEL, Liveness, Publisher
from ddptop.control.client import ControlClient, ControlError
from ddptop.control.commands import Replays, make_request, read_request
from ddptop.events import EventsRefused, RankBack, RankLost, StepDone, StepSpans, Span, TelemetryGap
from jobchannel import Served, job_keys

TOKEN = "store-values-token"
JOB = job_keys(TOKEN, "ab" * 16)


@pytest.fixture(scope="module")
def served():
    job = Served(JOB, world_size=3)
    yield job
    job.close()


def status(**changes) -> dict:
    return {"step": 5, "segment": 0, "world_size": 2, "paused": False, "t": time.time(), "job": JOB.job_id,
            "config": {"strategy": "ddp", "bucket_mb": 25.0, "async_op": False, "batch_size": 16, "lr": 0.1},
            **changes}


def as_rank0(served: Served, value) -> None:
    """What rank 0's agent syncs (the agent's key): the status the front then hands to `ctl`."""
    served.session("agent").call("sync", {"seen": 0, "status": value})


@pytest.mark.parametrize("value, words", [
    (status(world_size=100000000), "world_size is not a whole number in 1..65536"),
    (status(step="many"), "step is not a whole number"),
    (status(config={"strategy": "ring"}), "config: unknown strategy"),
    (status(t=float("inf")), "t is not a time"),
    (status(job="../../etc"), "job is not a job id"),
], ids=["world-size", "step", "strategy", "time", "job"])
def test_a_status_that_does_not_check_out_is_one_line_quickly(served, value, words, monkeypatch):
    monkeypatch.setattr("ddptop.control.client.STATUS_WAIT_S", 0.3)  # the retry is timed once, below
    as_rank0(served, value)
    with Calibrated() as cal:
        start = time.monotonic()
        with pytest.raises(ControlError) as caught:
            ControlClient("127.0.0.1", served.port, TOKEN).status()
        took = time.monotonic() - start
    assert took < cal.bound(3), (took, cal.factor)  # not the 2 s of retries a status gets (calibrate.py)
    assert words in str(caught.value) and "\n" not in str(caught.value)


def test_a_bad_status_is_retried_for_two_seconds_then_given_up(served):
    as_rank0(served, status(step=-1))
    client = ControlClient("127.0.0.1", served.port, TOKEN)
    with Calibrated() as cal:
        start = time.monotonic()
        with pytest.raises(ControlError, match="refused"):
            client.status()
        took = time.monotonic() - start
    # rank 0 sends its status twice a second: a real one would win; given up after 2 s, plus slack (calibrate.py)
    assert 2 <= took < 2 + cal.bound(2), (took, cal.factor)


def test_a_good_status_is_read_with_each_ranks_newest_beat(served):
    as_rank0(served, status())
    rank = served.rank_socket()
    rank.send_multipart([BEAT, b"0", json.dumps({"step": 7, "beat": 1}).encode()])
    rank.send_multipart([BEAT, b"1", json.dumps({"step": -9, "beat": 1}).encode()])  # out of range: not a beat
    rank.close(linger=1000)
    deadline = time.monotonic() + 5
    while 0 not in served.hub.liveness.beats and time.monotonic() < deadline:
        time.sleep(0.05)
    got = ControlClient("127.0.0.1", served.port, TOKEN).status()
    assert got["ranks"][0] == {"rank": 0, "step": 7} and got["ranks"][1] == {"rank": 1}
    assert served.hub.stats()["bad_messages"] >= 1


def step(rank: int, n: int) -> StepDone:
    return StepDone(rank, n, 0, 0, time.time(), 0.1, 0.0, 0.05, 0.01, 0.0, 0.0, 16, 2.3, 0, 0, 0, False)


def test_a_skipped_or_bad_batch_is_a_gap_and_the_rest_still_arrives(served):
    sock = served.rank_socket()
    good = lambda n: json.dumps([step(2, n).to_dict()]).encode()  # noqa: E731
    for seq, body in ((1, good(0)), (2, good(1)), (4, good(3)), (5, b"{not a list"), (6, good(5)),
                      (7, json.dumps([step(1, 6).to_dict(), step(2, 6).to_dict()]).encode())):
        sock.send_multipart([TEL, b"2", str(seq).encode(), body])  # seq 3 never sent; 5 is not a batch
    sock.close(linger=1000)
    events = served.events(lambda got: any(isinstance(e, EventsRefused) for e in got), 10)
    assert [e.step for e in events if isinstance(e, StepDone)] == [0, 1, 3, 5, 6]
    gaps = [(e.first_seq, e.last_seq) for e in events if isinstance(e, TelemetryGap)]
    assert gaps == [(3, 3), (5, 5)]
    refused = [e for e in events if isinstance(e, EventsRefused)]
    assert len(refused) == 1 and "claims rank 1" in refused[0].reason  # a rank speaks for itself alone


def test_a_batch_never_exceeds_the_cap_the_front_accepts(served):
    publisher = Publisher(served.rank_socket(), 1, interval_s=3600)
    spans = tuple(Span("bwd", f"features.{i}" * 20, 0.0, 0.001) for i in range(1500))  # ~100 KB each
    for n in range(50):
        publisher.emit(StepSpans(1, n, 0, time.time(), spans))
    publisher.flush()
    assert publisher.seq >= 2  # 5 MB of events: split under keys.MAX_BATCH_BYTES (the front drops > 9 MiB)
    got = served.events(lambda got: len([e for e in got if isinstance(e, StepSpans)]) >= 50, 20)
    assert [e.step for e in got if isinstance(e, StepSpans)] == list(range(50))
    publisher.close()


def test_a_rank_that_goes_silent_is_lost_and_one_that_comes_back_is_back():
    liveness = Liveness(3, lost_after_s=0.3)
    liveness.beat(2, 1, 1)
    assert liveness.check() == []
    time.sleep(0.4)
    with pytest.raises(ValueError):
        liveness.beat(2, -2, 2)  # out of range: never a beat
    lost = liveness.check()
    assert len(lost) == 1 and isinstance(lost[0], RankLost) and lost[0].rank == 2 and lost[0].last_step == 1
    liveness.beat(2, 3, 3)
    back = liveness.check()
    assert len(back) == 1 and isinstance(back[0], RankBack) and back[0].step == 3 and back[0].silent_s >= 0.3


def request(request_id: int = 7, **body) -> dict:
    return {**make_request("pause", None, "tester"), "id": request_id, **body}


@pytest.mark.parametrize("raw, words", [
    # built when pytest collects, which can be many minutes before the test runs: offsets far past that gap
    (request(7, t=time.time() - 86400), "outside ±60 s"),
    (request(7, t=time.time() + 86400), "outside ±60 s"),
    (request(7, op="reboot"), "malformed"),
    (request(7, t=float("nan")), "malformed"),
    (request(7, id="7"), "malformed"),
    (request(7, who="x" * 100000), "malformed"),
    ([request(7)], "malformed"),
], ids=["stale", "future", "bad-op", "nan-time", "id-type", "huge", "not-an-object"])
def test_a_request_is_refused_unless_fresh_and_well_formed(raw, words):
    with pytest.raises(ValueError, match=words):
        read_request(raw, Replays())


def test_a_request_is_accepted_once():
    replays = Replays()
    raw = request(9)
    assert read_request(raw, replays)["op"] == "pause"
    with pytest.raises(ValueError, match="already accepted once"):
        read_request(raw, replays)
