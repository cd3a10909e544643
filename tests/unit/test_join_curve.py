"""The join of a job with a token goes over the front's CURVE sockets (issue 41): a raw ZeroMQ client with the join
role's key, derived from the token as the ranks derive it, is answered; one with a key from another token, or a
rank's key, fails CURVE's handshake and the hub reads none of its bytes; the hub keeps each rank's first hello and
rank 0's verdict, and a real join through it (train/join.py, two ranks in threads) agrees or names the difference."""

from __future__ import annotations

import json
import threading
import time

import pytest
import zmq
from zmq.utils import z85
from zmq.utils.monitor import parse_monitor_message

from ddptop.control import transport
from ddptop.control.auth import JobKeys, derive
from ddptop.control.session import SessionError
from ddptop.errors import RendezvousError
from ddptop.train.join import FrontBoard, join
from jobchannel import SALT, Served, job_keys, rank_only

TOKEN = "join-test-token-0123"
JOB = job_keys(TOKEN, "cd" * 16)


@pytest.fixture
def served():
    job = Served(JOB, world_size=2)
    yield job
    job.close()


def raw_dealer(served: Served, secret: bytes) -> tuple[zmq.Socket, zmq.Socket]:
    """A DEALER that speaks CURVE with `secret` to the key the store's public `channel` names, and its monitor."""
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.curve_secretkey = z85.encode(secret)
    sock.curve_publickey = zmq.curve_public(z85.encode(secret))
    sock.curve_serverkey = served.ports["key"].encode()
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDTIMEO, 5000)  # a handshake refused before the send leaves no pipe: never block on it
    monitor = sock.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_HANDSHAKE_FAILED_AUTH
                                      | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL)
    sock.connect(transport.endpoint("127.0.0.1", served.ports["ctl"]))
    return sock, monitor


def ask(sock: zmq.Socket, monitor: zmq.Socket, op: str, body: dict, wait_s: float = 5.0) -> tuple[list, dict | None]:
    """Send [id, op, JSON] as any client of the hub does: (the handshake's events, the reply or None)."""
    try:
        sock.send_multipart([b"1", op.encode(), json.dumps(body).encode()])
    except zmq.Again:  # refused before the send (CI's hang in stop 51): the monitor still says how
        pass
    events, reply, deadline = [], None, time.monotonic() + wait_s
    # until a reply and the handshake's event, or a failed handshake: the monitor's event comes over a socket of
    # its own and, under load, after the reply (a CI run beside two busy loops read the reply first)
    while time.monotonic() < deadline and (reply is None or not events) and not any(
            e != zmq.EVENT_HANDSHAKE_SUCCEEDED for e in events):
        if monitor.poll(10):
            events.append(parse_monitor_message(monitor.recv_multipart())["event"])
        if reply is None and sock.poll(10):
            reply = json.loads(sock.recv_multipart()[-1])
    sock.close(linger=0)
    monitor.close(linger=0)
    return events, reply


def a_hello(rank: int, **more) -> dict:
    return {"rank": rank, "world_size": 2, "host": "h", "pid": 100 + rank, "nonce": f"n{rank}", **more}


def test_the_join_key_from_the_token_is_answered_and_any_other_key_is_refused_unread(served):
    """The join role's key is derive(scrypt(token, salt), "curve join") (transport.secret): computed here from the
    token and the public salt, not by ddptop's own socket code."""
    right = derive(JobKeys.from_token(TOKEN, "", SALT).control, "curve join")
    events, reply = ask(*raw_dealer(served, right), "hello", {"hello": a_hello(1)})
    assert events == [zmq.EVENT_HANDSHAKE_SUCCEEDED] and reply == {"hello": a_hello(1)}, (events, reply)
    assert list(served.hub.hellos) == [1]
    before = dict(served.hub.stats())
    wrong = derive(JobKeys.from_token("another-token-0123", "", SALT).control, "curve join")
    for secret in (wrong, rank_only(JOB).ranks, z85.decode(zmq.curve_keypair()[1])):
        events, reply = ask(*raw_dealer(served, secret), "hello", {"hello": a_hello(0, host="stranger")})
        assert reply is None and zmq.EVENT_HANDSHAKE_SUCCEEDED not in events and events, events
    after = served.hub.stats()
    assert after["refused_keys"] >= before["refused_keys"] + 3  # ZAP said no to each key
    assert after["bad_messages"] == before["bad_messages"]  # and the hub read none of their bytes
    assert list(served.hub.hellos) == [1] and served.hub.verdict is None


def test_the_hub_keeps_the_first_hello_per_rank_and_only_the_join_role_may_join(served):
    board = served.session("join")
    assert board.call("hello", {"hello": a_hello(1)}) == {"hello": a_hello(1)}
    assert board.call("hello", {"hello": a_hello(1, host="second")}) == {"hello": a_hello(1)}  # first one stays
    for bad in (a_hello(2), a_hello(-1), a_hello(True), {"rank": "0"}, "hello", a_hello(0, pad="x" * 70000)):
        with pytest.raises(SessionError):
            board.call("hello", {"hello": bad})
    assert board.call("joined") == {"ranks": [1]} and board.call("verdict") == {"verdict": None}
    for role in ("ctl", "attach", "agent"):
        with pytest.raises(SessionError, match=f"{role} may not ask 'hello'"):
            served.session(role).call("hello", {"hello": a_hello(0)})
    with pytest.raises(SessionError, match="join may not ask 'request'"):
        board.call("request", {"op": "stop"})
    assert list(served.hub.hellos) == [1] and served.hub.made == 0


def _join_in_thread(served: Served, rank: int, hello: dict, job: JobKeys, timeout_s: float,
                    out: dict) -> threading.Thread:
    def run() -> None:
        try:
            out[rank] = join(FrontBoard("127.0.0.1", served.ports["ctl"], job), rank, 2, hello, timeout_s, True)
        except RendezvousError as exc:
            out[rank] = str(exc)

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def test_two_ranks_join_through_the_front_and_a_difference_is_said_on_both_sides(served):
    job = JobKeys.from_token(TOKEN, "", SALT)
    out: dict = {}
    threads = [_join_in_thread(served, r, a_hello(r), job, 20, out) for r in (0, 1)]
    for thread in threads:
        thread.join()
    assert [h["rank"] for h in out[0]] == [0, 1] and out[1] == [], out
    assert served.hub.verdict["ok"] and set(served.hub.verdict["nonces"]) == {"0", "1"}


def test_a_different_rank_is_refused_on_both_sides_and_a_wrong_token_waits_out_its_timeout():
    served = Served(JOB, world_size=2)
    try:
        job = JobKeys.from_token(TOKEN, "", SALT)
        out: dict = {}
        threads = [_join_in_thread(served, 0, a_hello(0, ddptop_version="1"), job, 20, out),
                   _join_in_thread(served, 1, a_hello(1, ddptop_version="2"), job, 20, out)]
        for thread in threads:
            thread.join()
        assert out[0] == out[1] == "rank 1 has ddptop version 2, rank 0 has 1", out
    finally:
        served.close()
    served = Served(JOB, world_size=2)
    try:
        out = {}
        _join_in_thread(served, 1, a_hello(1), JobKeys.from_token("wrong-token-0123", "", SALT), 1.5, out).join()
        assert out[1] == ("rank 0 did not answer the handshake within 1.5 s (its front refused this rank's key): "
                          "is it running, with the same --token (or DDPTOP_TOKEN)?"), out
        assert served.hub.hellos == {}
    finally:
        served.close()
