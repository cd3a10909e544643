"""The job's transport (ZeroMQ with CURVE, control/transport.py, hub.py, session.py) against a real hub: a wrong key
gets nothing, each role only its rights, a late reply is never taken for the next call's, and garbage, an oversized
message or a 2^31 length prefix changes nothing."""

from __future__ import annotations

import json
import socket
import struct
import threading
import time

import pytest
import zmq

from ddptop.control import transport
from ddptop.control.auth import JobKeys
from ddptop.control.bus import BEAT, TEL
from ddptop.control.session import Session, SessionError, SessionRefused, SessionTimeout
from ddptop.events import LogLine
from jobchannel import Served, job_keys, rank_only

JOB = job_keys("transport-test-token", "ab" * 16)


@pytest.fixture
def served():
    job = Served(JOB, world_size=2)
    yield job
    job.close()


def batch(rank: int, seq: int, text: str = "hello") -> list[bytes]:
    body = json.dumps([LogLine(rank, "info", text, time.time()).to_dict()]).encode()
    return [TEL, str(rank).encode(), str(seq).encode(), body]


def messages(served: Served, n: int) -> list:
    return served.events(lambda got: len([e for e in got if isinstance(e, LogLine)]) >= n, 10)


def test_a_wrong_token_is_refused_at_once_and_reads_nothing(served):
    served.session("ctl").call("request", {"op": "pause", "changes": {}, "who": "t", "nonce": "n", "t": 1.0})
    stranger = JobKeys.from_token("another-token-here", JOB.job_id, b"a-test-salt-16-b")
    began = time.monotonic()
    with pytest.raises(SessionRefused, match="wrong token"):
        Session("127.0.0.1", served.ports["ctl"], stranger, "ctl", 10).call("status")
    assert time.monotonic() - began < 5  # the handshake's failure, not the 10 s timeout
    assert served.hub.requests and served.hub.made == 1  # nothing read, nothing changed


def test_a_call_after_its_handshake_already_failed_is_refused_not_a_hang(served):
    """CI's hang in stop 51: a DEALER whose key the front's ZAP refuses (the server's key right, its own not admitted)
    loses its only pipe a moment after the handshake fails, and a plain send on it then blocks for ever. Here the
    refusal comes first (the socket opened, the monitor's failure event waited for, then a second for the pipe to
    go: enough here to block the old code's send every time), then the call: "refused" within seconds."""
    stranger = Session("127.0.0.1", served.ports["ctl"], rank_only(JOB), "rank", 10)
    stranger._open()
    assert stranger._monitor.poll(5000), "the hub never refused the rank key's handshake"
    time.sleep(1.5)
    outcome: list = []

    def call():
        try:
            stranger.call("status")
        except SessionError as e:
            outcome.append(e)

    caller = threading.Thread(target=call, daemon=True)
    began = time.monotonic()
    caller.start()
    caller.join(20)
    assert not caller.is_alive(), "the call hung on a socket whose handshake had failed"
    assert len(outcome) == 1 and isinstance(outcome[0], SessionRefused), outcome
    assert "refused" in str(outcome[0]) and time.monotonic() - began < 5
    assert served.hub.made == 0


def test_each_role_has_only_its_rights(served):
    request = {"op": "pause", "changes": {}, "who": "t", "nonce": "n", "t": 1.0}
    for role, op in (("attach", "request"), ("attach", "sync"), ("ctl", "sync"), ("agent", "request"),
                     ("agent", "say")):
        with pytest.raises(SessionError, match=f"{role} may not ask"):
            served.session(role).call(op, request)
    assert served.hub.made == 0
    # a rank's key opens the telemetry socket only: the request socket refuses its handshake (ZAP), and so does the
    # republished stream
    ranks = Session("127.0.0.1", served.ports["ctl"], rank_only(JOB), "rank", 5)
    with pytest.raises(SessionRefused):
        ranks.call("status")
    refused = served.hub.stats()["refused_keys"]
    assert refused >= 1
    # the telemetry socket admits no other role: a ctl key's batch never arrives
    ctl_push = transport.client_socket(zmq.PUSH, JOB, "ctl", transport.endpoint("127.0.0.1", served.ports["tel"]))
    ctl_push.send_multipart(batch(0, 1, "forged"), zmq.NOBLOCK)
    real = served.rank_socket()
    real.send_multipart(batch(1, 1, "real"))
    got = messages(served, 1)
    assert [e.message for e in got if isinstance(e, LogLine)] == ["real"]
    assert served.hub.stats()["refused_keys"] > refused
    ctl_push.close()
    real.close()


def test_a_late_reply_is_never_taken_for_the_next_call():
    """A server that answers the first call after the client gave up: the client's next call, on a fresh socket,
    gets its own answer (before issue 41 the stale one was read as the answer to the next call)."""
    server = transport.Server("127.0.0.1", JOB)
    sock = server.sockets["ctl"]
    stop = threading.Event()

    def serve() -> None:
        held = []
        while not stop.is_set():
            if not sock.poll(50):
                continue
            who, request_id, op, body = sock.recv_multipart()
            if op == b"slow":
                held.append((who, request_id))
                continue
            for late_who, late_id in held:  # the late answer, just before this call's own
                sock.send_multipart([late_who, late_id, b'{"which": "slow"}'])
            held = []
            sock.send_multipart([who, request_id, b'{"which": "fast"}'])

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        client = Session("127.0.0.1", server.ports["ctl"], JOB, "ctl", 0.5)
        with pytest.raises(SessionTimeout):
            client.call("slow")
        assert client.call("fast") == {"which": "fast"}
        assert client.call("fast") == {"which": "fast"}
    finally:
        stop.set()
        thread.join()
        server.close()


def test_garbage_an_oversized_message_and_a_huge_length_prefix_change_nothing(served):
    ports = served.ports
    for port in (ports["tel"], ports["ctl"], ports["pub"]):
        for junk in (b"\x00" * 64, b"GET / HTTP/1.1\r\n\r\n", b"\xff" + struct.pack(">Q", 1 << 31) + b"x" * 100,
                     b"\xff\x00\x00\x00\x00\x80\x00\x00\x01\x7f\x03\x00NULL" + b"\x00" * 44 + b"\x02\xff\xff\xff\xff"):
            with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
                raw.sendall(junk)
                time.sleep(0.05)
    rank = served.rank_socket()
    rank.send_multipart([TEL, b"0", b"1", b"x" * (transport.MAX_TEL_BYTES + 1)])  # over maxmsgsize: dropped
    rank.close(linger=1000)
    fresh = served.rank_socket()
    fresh.send_multipart([b"?", b"garbage"])  # authenticated, but not a rank's message: counted
    fresh.send_multipart([BEAT, b"0", b"not json"])
    fresh.send_multipart(batch(0, 1, "still here"))
    got = messages(served, 1)
    assert [e.message for e in got if isinstance(e, LogLine)] == ["still here"]
    assert served.hub.stats()["bad_messages"] == 2
    assert served.session("ctl").call("status")["status"] is None  # the hub still answers
    fresh.close()


def test_captured_traffic_neither_reads_nor_replays(served):
    """A stranger who captured every byte between `ctl` and the front (here through a relay that copies them) reads
    no request in it and, replaying the client's bytes, makes the front do nothing (CURVE: encrypted, fresh
    session keys)."""
    captured = bytearray()
    listener = socket.create_server(("127.0.0.1", 0))
    relay_port = listener.getsockname()[1]

    def relay() -> None:
        near, _ = listener.accept()
        far = socket.create_connection(("127.0.0.1", served.ports["ctl"]))

        def pump(src, dst, record) -> None:
            try:
                while data := src.recv(65536):
                    if record:
                        captured.extend(data)
                    dst.sendall(data)
            except OSError:
                pass

        threading.Thread(target=pump, args=(far, near, False), daemon=True).start()
        pump(near, far, True)

    threading.Thread(target=relay, daemon=True).start()
    client = Session("127.0.0.1", relay_port, JOB, "ctl", 10)
    secret = "pause-the-job-now"
    client.call("request", {"op": "pause", "changes": {}, "who": secret, "nonce": "n", "t": 1.0})
    client.close()
    assert served.hub.made == 1 and len(captured) > 100
    assert secret.encode() not in captured and b"pause" not in captured
    with socket.create_connection(("127.0.0.1", served.ports["ctl"]), timeout=5) as replay:
        replay.sendall(bytes(captured))
        time.sleep(1.0)
    assert served.hub.made == 1, "the replayed request was not taken"
    listener.close()
