"""Issue 14's attacks, each against one real running job by a stranger who knows only its address and port.

One job (started by whichever test needs it first) serves the tests of this file, but each test makes its own
attack and checks its own outcome, in what the job answers and in its live recording (SQL on the file), so any
one of them runs alone or in any order. The last stops the job and checks what it printed and recorded: not
driven (every switch was the user's), not corrupted (every step of both ranks, once), not hung. The tests time
the job getting past each attack (`< 5 s`): they run in `make test`'s `alone` phase.
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import time

import psutil
import pytest

from calibrate import Calibrated

from security_job import LOST_AFTER_S, TOKEN, stranger
import zmq

from ddptop.control.agent import HEARTBEAT_EVERY_S
from ddptop.control.session import read_endpoints
from ddptop.control.client import ControlClient
from ddptop.control.commands import make_request
from ddptop.events import ConfigApplied, RankBack, RankLost, StepDone
from ddptop.front.pipeline import LIVENESS_EVERY_S
from ddptop.record.reader import Recording
from test_bad_input import main
from test_run_cli import DDPTOP


# alone: one test stops rank 1 for --lost-after + 3.5 s and checks that only rank 1 was reported lost, a verdict a
# neighbour that delays rank 0's beats past --lost-after would change (the bounds on time are calibrated)
pytestmark = pytest.mark.alone

ESC = "\x1b]0;pwned\x07\x1b[2J"
MEASURED: dict[str, float] = {}  # attack -> seconds the job needed to get past it (printed by the last test)


def test_a_half_sent_message_left_hanging_does_not_freeze_the_store(job):
    hanging = socket.create_connection(("127.0.0.1", job.port))
    hanging.sendall(b"\x01")  # the first byte of a request, then nothing: the old server blocked ~75 s here
    job.kept.append(hanging)
    with Calibrated() as cal:
        start = time.monotonic()
        job.client.status()
        took = MEASURED["one byte left hanging: ctl status answers after"] = time.monotonic() - start
    assert took < cal.bound(2), (took, cal.factor)
    assert job.advances(0) < cal.bound(5) and job.advances(1) < cal.bound(5)


def test_a_flood_half_handshakes_and_strangers_keys_on_the_front_neither_stall_the_job_nor_keep_ctl_out(job):
    ports = read_endpoints(stranger(job.port), 5)  # the front's ports and public key are public (a store key)
    kept = []
    for name in ("tel", "ctl", "pub"):
        hanging = socket.create_connection(("127.0.0.1", ports[name]))
        hanging.sendall(b"\xff\x00\x00\x00\x00\x00\x00\x00\x01\x7f\x03")  # half a ZMTP greeting, then nothing
        kept += [hanging] + [socket.create_connection(("127.0.0.1", ports[name])) for _ in range(128)]  # idle
    # a stranger's own CURVE keys, with the front's public key from the store: the handshake completes, ZAP refuses
    ctx = zmq.Context.instance()
    public, secret = zmq.curve_keypair()
    strangers = []
    for name in ("tel", "ctl"):
        sock = ctx.socket(zmq.PUSH if name == "tel" else zmq.DEALER)
        sock.curve_publickey, sock.curve_secretkey, sock.curve_serverkey = public, secret, ports["key"].encode()
        sock.connect(f"tcp://127.0.0.1:{ports[name]}")
        sock.send_multipart([b"t", b"1", b"1", b"[]"] if name == "tel" else [b"1", b"request", b"{}"], zmq.NOBLOCK)
        strangers.append(sock)
    job.kept += kept
    with Calibrated() as cal:
        start = time.monotonic()
        job.client.status()  # the connection it holds
        ControlClient("127.0.0.1", job.port, TOKEN).status()  # a fresh client: connects, proves the key, reads
        took = MEASURED["half greetings + 384 idle connections + strangers' keys: a new ctl client answers after"] = (
            time.monotonic() - start)
    assert took < cal.bound(3), (took, cal.factor)
    assert job.advances(0) < cal.bound(5) and job.advances(1) < cal.bound(5)
    said = job.recorded("log", lambda rows: [e for e in rows if "not one of the job's roles" in e["message"]])
    assert [e for e in said if "not one of the job's roles" in e["message"] and e["rank"] == -1], said
    for sock in strangers:
        sock.close(linger=0)


def test_forged_control_keys_do_not_drive_the_job(job):
    s = stranger(job.port)
    s.add("ctl/seq", 1000000)  # once disabled control: rank 0 waited on a million ids
    forged = {"config": {"strategy": "single", "bucket_mb": 25.0, "async_op": False, "batch_size": 16, "lr": 0.1},
              "who": "stranger"}
    for n in range(1, 40):  # once applied unchecked by rank 1 (single on one rank, DDP on the other: a deadlock)
        s.set(f"ctl/decision/{n}", json.dumps(forged))
        s.set(f"ctl/req/{n}", json.dumps({"op": "stop", "changes": {}, "who": "stranger", "mac": "0" * 64}))
    start = time.monotonic()
    answer = job.client.send("set", {"strategy": "allreduce"}, timeout_s=30)
    MEASURED["forged ctl/seq, ctl/decision, ctl/req: a signed set applied after"] = time.monotonic() - start
    assert answer["state"] == "applied"
    applied = job.recorded("config_applied", lambda rows: len(mine(rows, answer["request_id"])) == 2)
    assert {(e["rank"], e["config"]["strategy"]) for e in mine(applied, answer["request_id"])} == {(0, "allreduce"),
                                                                                                (1, "allreduce")}
    assert not [e for e in applied if e["who"] == "stranger"]
    with Calibrated() as cal:
        start = time.monotonic()
        assert job.client.send("pause")["ok"] and job.client.send("resume")["ok"]
        took = time.monotonic() - start
    assert took < cal.bound(3), (took, cal.factor)
    assert job.advances(1) < cal.bound(5)


def test_a_resent_or_stale_request_is_refused_and_recorded(job):
    """Even with the ctl key, a request sent twice (the same nonce) or made two minutes ago is refused by rank 0.
    (Nobody without the token can see one to copy it: CURVE encrypts every message.)"""
    body = make_request("pause", None, "the user")
    first = job.client._call("request", body)["id"]
    assert job.client.response(first)["ok"]
    assert job.client.send("resume")["ok"]
    replay = job.client._call("request", body)["id"]  # the same request again
    answer = job.client.response(replay)
    assert not answer["ok"] and "replay" in answer["error"]
    stale = job.client._call("request", {**make_request("pause", None, "the user"), "t": time.time() - 120})["id"]
    answer = job.client.response(stale)
    assert not answer["ok"] and "outside ±60 s" in answer["error"]
    refused = job.recorded("control_refused", lambda rows: {replay, stale} <= {e["request_id"] for e in rows})
    assert {replay, stale} <= {e["request_id"] for e in refused}
    job.advances(0)  # a newer step within 10 s times the slowdown (security_job)


def test_forged_status_and_heartbeats_neither_crash_ctl_nor_lose_a_rank(job):
    lost_before = len(job.recorded("rank_lost", within_s=0))
    s = stranger(job.port)
    s.set("ctl/status", "{not json")
    s.set("ctl/status", json.dumps({"world_size": 100000000, "step": 0, "segment": 0, "config": {}}))
    deadline = time.monotonic() + LOST_AFTER_S + 2  # a stale constant once marked rank 1 lost, for good
    while time.monotonic() < deadline:
        s.set("hb/1", "constant")
        s.set("hb/0", "constant")
        time.sleep(0.05)
    start = time.monotonic()
    code, out, err = main("ctl", "status")  # what `ddptop ctl status` runs, in this process (no torch import)
    MEASURED["forged ctl/status (bad JSON, world_size 1e8): ctl status took"] = time.monotonic() - start
    assert code == 0, err
    rows = [line.split()[0] for line in out.splitlines()[2:] if line.strip()]  # one row per rank, its number first
    assert "running" in out and rows == ["0", "1"], out
    assert len(job.recorded("rank_lost", within_s=0)) == lost_before  # a stale constant once marked rank 1 lost


def test_forged_telemetry_reaches_neither_screen_nor_recording(job):
    s = stranger(job.port)
    forged = [{"kind": "run_finished", "v": 1, "rank": 1, "steps": 999999, "reason": "FORGED" + ESC, "t": 1.0},
              {"kind": "log", "v": 1, "rank": 1, "level": "error", "message": "FORGED" + ESC, "t": 1.0}]
    s.set("tel/1/head", "1000000")  # once: ~60 s of silence, rank 1 never recorded again, `info` said complete
    for seq in range(1, 300):
        s.set(f"tel/1/{seq}", json.dumps(forged))
    s.set("tel/1/1000000", json.dumps(forged))
    job.advances(1)  # a newer step within 10 s times the slowdown (security_job)


def test_oversized_values_are_refused_without_growing_the_front(job):
    front = psutil.Process(job.proc.pid)
    before = front.memory_info().rss
    refused = 0
    for n in range(7):  # once: 7 x 100 MB took the front from 527 MB to 1.21 GB
        try:
            stranger(job.port).set(f"big/{n}", b"x" * (100 << 20))
        except Exception:  # torch's libuv server drops a client that sends a value over 8 MiB
            refused += 1
    grown = (front.memory_info().rss - before) / 1e6
    MEASURED["7 x 100 MB values: front RSS grew (MB)"] = grown
    assert refused == 7 and grown < 50
    job.advances(0)  # a newer step within 10 s times the slowdown (security_job)


def test_filling_the_store_is_noticed_and_said(job):
    """README: a store filled with many smaller values is reported once, not stopped. Once: the front checks the
    key count every second (LIVENESS_EVERY_S), so after the first report a second flood and several more checks
    (the job advancing meanwhile: its front pumps) must leave exactly one `store_flooded` row."""
    s = stranger(job.port)
    s.multi_set([f"junk/{n}" for n in range(1600)], [b"x"] * 1600)  # more keys than 2 ranks ever write (1536)
    first = job.recorded("store_flooded")
    assert len(first) == 1, first or "the front said nothing"
    assert first[0]["keys"] >= 1600 and first[0]["keys"] > first[0]["expected"], first  # at least the keys we put
    s.multi_set([f"junk/more/{n}" for n in range(400)], [b"x"] * 400)  # still flooded, and more so
    job.advances(0)  # a newer step within 10 s times the slowdown (security_job)
    # a second report, if any, comes within a check (1 s) and a commit (0.5 s): 4 checks' worth, then exactly one
    rows = job.recorded("store_flooded", until=lambda rows: len(rows) > 1, within_s=4 * LIVENESS_EVERY_S + 0.5)
    assert len(rows) == 1, rows
    job.advances(0)  # a newer step within 10 s times the slowdown (security_job)


def test_a_stopped_rank_is_reported_lost_then_back(job):
    lost_before, back_before = len(job.recorded("rank_lost", within_s=0)), len(job.recorded("rank_back", within_s=0))
    rank1 = job.ranks()[1]
    rank1.suspend()  # SIGSTOP: once marked lost forever, and info said both "1 ranks lost" and "finished"
    time.sleep(LOST_AFTER_S + 3.5)  # the last beat can be seen up to 1 s late, and the front checks once a second
    rank1.resume()
    start = time.monotonic()
    job.advances(1, within_s=10)  # trains again (10 s times the slowdown, security_job)
    MEASURED["SIGCONT after SIGSTOP: rank 1 trains again after"] = time.monotonic() - start
    # its next beat (every 1 s) reaches the front, which looks once a second: "back" is said within ~2 s of that,
    # and recorded within the writer's 0.5 s commit (polled: a loaded machine gets more)
    back = job.recorded("rank_back", lambda rows: len(rows) > back_before, within_s=4 * HEARTBEAT_EVERY_S + 6)
    lost = job.recorded("rank_lost", within_s=0)
    assert [e["rank"] for e in lost[lost_before:]] == [1] and [e["rank"] for e in back[back_before:]] == [1]
    assert f"no heartbeat for {LOST_AFTER_S} s" in lost[-1]["reason"]


def test_the_job_stops_cleanly_and_its_output_and_recording_say_what_happened(job):
    out, err, took = job.stop(signal.SIGTERM)  # with the half-sent message still hanging on the store
    MEASURED["SIGTERM with a client hanging on the store: exit after"] = took
    for what, seconds in MEASURED.items():
        print(f"{what}: {seconds:.2f}")
    assert job.proc.returncode == 0 and took < 30, err
    assert "Traceback" not in out + err and "\x1b" not in out + err and "FORGED" not in out + err
    finished = [line for line in out.splitlines() if line.startswith("finished: ")]  # the closing lines follow
    assert len(finished) == 1 and finished[0].endswith("(stopped)")
    with Recording.open(str(job.record)) as rec:
        events = list(rec.events())
        assert rec.complete
    for rank in (0, 1):  # every step of both ranks, once and in order: nothing forged, nothing lost
        steps = [e.step for e in events if isinstance(e, StepDone) and e.rank == rank]
        assert steps == list(range(len(steps))) and len(steps) > 20
    switches = [e for e in events if isinstance(e, ConfigApplied) and e.who != "start"]
    assert all(e.who.startswith("ctl@") for e in switches)  # whatever ran before: only the user's
    marks = [(type(e), e.rank) for e in events if isinstance(e, (RankLost, RankBack))]
    assert all(m in ((RankLost, 1), (RankBack, 1)) for m in marks), marks  # only ever the SIGSTOP test's rank
    info = subprocess.run(DDPTOP + ["info", str(job.record)], capture_output=True, text=True, timeout=60)
    assert info.returncode == 0 and "complete)" in info.stdout
    assert "FORGED" not in info.stdout
    # a recording is handed around (reports, course hand-ins): the job's token is in none of its bytes
    assert TOKEN.encode() not in job.record.read_bytes()
    with Recording.open(str(job.record)) as rec:
        assert "--token REDACTED" in " ".join(rec.meta["argv"])


def mine(rows: list[dict], request_id: int) -> list[dict]:
    return [e for e in rows if e["request_id"] == request_id]


@pytest.fixture(autouse=True)
def _env(job, monkeypatch):
    monkeypatch.setenv("DDPTOP_STATE_DIR", job.env["DDPTOP_STATE_DIR"])
