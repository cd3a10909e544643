"""A stranger on a lab's network, for tests/lab/test_sniffed_traffic.py: run inside a lab host's namespace as
`python tests/stranger.py IN.json`, it prints what it got as one JSON object.

With no keys in IN.json it knows what anyone on the network knows: the job's store (its public keys: the salt, the
front's ports and public key) and a capture of the job's traffic. It replays each captured connection's client
bytes to the front, in order, on a fresh TCP connection, reading what the front answers where the real client had
waited; and it opens ZeroMQ sockets with a keypair of its own on each of the front's sockets, asking what each role
may ask, pushing a forged telemetry batch and subscribing to the stream. Given `secrets` (the test derives them from
the token), it asks the same way with them: the control that shows these paths reach the front at all.

IN.json: {"master", "port" (the store's), "replays": [[port, [["c", hex] | ["s", bytes], ...]], ...],
          "secrets": {"ctl": hex, "attach": hex} (optional), "wait_s": how long to wait for any answer}
"""

from __future__ import annotations

import json
import socket
import sys
import time

import zmq
from zmq.utils import z85
from zmq.utils.monitor import parse_monitor_message

from ddptop.control import keys, litestore, session
from ddptop.control.commands import make_request
from ddptop.events import LogLine

MARK = "stranger-was-here"  # in every forged event: the recording must never hold it


def look(master: str, port: int) -> dict:
    """The store's public keys, as any client reads them."""
    public = litestore.connect(master, port, 5.0, keys.DDPTOP_PREFIX)
    try:
        return {"salt": session.read_salt(public, 5.0).hex(), **session.read_endpoints(public, 5.0)}
    finally:
        public.close()


def replay(master: str, port: int, turns: list, wait_s: float) -> dict:
    """One captured connection's client bytes on a new TCP connection: each client turn sent whole, and where the
    server spoke, its reply read (as many bytes as the real server sent by then, or for wait_s at most)."""
    got, sent, expected, closed = bytearray(), 0, 0, False
    with socket.create_connection((master, port), timeout=5) as s:
        for way, data in turns:
            if way == "c":
                try:
                    s.sendall(bytes.fromhex(data))
                    sent += len(data) // 2
                except OSError:
                    closed = True
                    break
            else:
                expected += data
                closed = _read(s, got, expected, time.monotonic() + wait_s)
                if closed:
                    break
        if not closed:  # whatever it still says, or that it hung up
            closed = _read(s, got, 1 << 40, time.monotonic() + wait_s)
    return {"port": port, "sent": sent, "reply": got.hex(), "closed": closed}


def _read(s: socket.socket, got: bytearray, upto: int, deadline: float) -> bool:
    """Read into `got` until it holds `upto` bytes or the deadline; True when the peer closed the connection."""
    while len(got) < upto and (left := deadline - time.monotonic()) > 0:
        s.settimeout(left)
        try:
            part = s.recv(1 << 16)
        except socket.timeout:
            return False
        except OSError:
            return True
        if not part:
            return True
        got += part
    return False


def curve(ctx: zmq.Context, kind: int, server_key: str, secret: bytes | None) -> tuple[zmq.Socket, zmq.Socket]:
    """A socket that speaks CURVE to the front's key with `secret` (None: a fresh random keypair), and a monitor
    of its handshake."""
    sock = ctx.socket(kind)
    if secret is None:
        public_key, secret_key = zmq.curve_keypair()
    else:
        secret_key = z85.encode(secret)
        public_key = zmq.curve_public(secret_key)
    sock.curve_secretkey, sock.curve_publickey, sock.curve_serverkey = secret_key, public_key, server_key.encode()
    sock.setsockopt(zmq.LINGER, 0)
    return sock, sock.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_HANDSHAKE_FAILED_AUTH
                                         | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
                                         | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL)


def handshakes(monitor: zmq.Socket) -> list[str]:
    names = {zmq.EVENT_HANDSHAKE_SUCCEEDED: "succeeded", zmq.EVENT_HANDSHAKE_FAILED_AUTH: "refused",
             zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL: "protocol", zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL: "failed"}
    seen = []
    while monitor.poll(0):
        event = parse_monitor_message(monitor.recv_multipart())["event"]
        seen.append(names.get(event, str(event)))
    monitor.close(linger=0)
    return seen


class Attempt:
    """One socket to the front: a request on its ROUTER ([id, op, JSON], as the hub's clients send it), a
    subscription to its PUB, or forged telemetry on its PULL; `finish` says what came back and how the handshake
    went."""

    def __init__(self, ctx, kind: int, endpoint: str, server_key: str, secret: bytes | None, what: str):
        self.what, self.replies = what, []
        self.sock, self.monitor = curve(ctx, kind, server_key, secret)
        if kind == zmq.SUB:
            self.sock.setsockopt(zmq.SUBSCRIBE, b"")
        self.sock.connect(endpoint)

    def send(self, *parts: bytes) -> None:
        try:
            self.sock.send_multipart(list(parts), zmq.NOBLOCK)
        except zmq.Again:  # a DEALER or PUSH with no handshake done may refuse to queue: nothing was sent
            pass

    def finish(self) -> dict:
        self.sock.close(linger=0)
        return {"what": self.what, "replies": self.replies, "handshakes": handshakes(self.monitor)}


def attempt_all(attempts: list[Attempt], wait_s: float, until_each_answered: bool = False) -> list[dict]:
    """Everything each socket receives within wait_s (all at once: one wait for all), or until each has received
    something when `until_each_answered`."""
    poller = zmq.Poller()
    for a in attempts:
        poller.register(a.sock, zmq.POLLIN)
    deadline = time.monotonic() + wait_s
    while (left := deadline - time.monotonic()) > 0 and not (until_each_answered and all(a.replies for a in attempts)):
        for sock, _ in poller.poll(int(left * 1000) + 1):
            a = next(a for a in attempts if a.sock is sock)
            a.replies.append(sock.recv_multipart()[-1].decode("utf-8", "replace")[:300])
    return [a.finish() for a in attempts]


def forged_telemetry() -> list[list[bytes]]:
    """Rank 1's telemetry as a rank sends it: a batch far ahead in its sequence, and a heartbeat."""
    batch = json.dumps([LogLine(1, "warning", MARK, time.time()).to_dict()]).encode()
    return [[b"t", b"1", b"100000", batch], [b"h", b"1", json.dumps({"beat": 1, "step": 10 ** 6,
                                                                     "paused": False}).encode()]]


def main(path: str) -> dict:
    given = json.loads(open(path).read())
    master, wait_s = given["master"], given["wait_s"]
    public = look(master, given["port"])
    out = {"public": public, "replays": [replay(master, port, turns, wait_s) for port, turns in given["replays"]]}
    at = {name: f"tcp://{master}:{public[name]}" for name in ("tel", "ctl", "pub")}
    ctx = zmq.Context()
    secrets = {role: bytes.fromhex(h) for role, h in given.get("secrets", {}).items()}
    if secrets:  # the control: the same calls, with the keys the token gives
        asks = [(secrets["ctl"], "status", {})]
        listeners = [Attempt(ctx, zmq.SUB, at["pub"], public["key"], secrets["attach"], "subscribe")]
    else:  # what each role may ask (hub.RIGHTS), with a key of its own
        asks = [(None, "status", {"steps": True}), (None, "request", make_request("pause", None, "stranger")),
                (None, "sync", {"seen": 10 ** 6, "status": {"note": MARK}}), (None, "answer", {"id": 1}),
                (None, "hello", {"hello": {"rank": 1, "world_size": 2, "host": MARK, "pid": 1, "nonce": MARK}})]
        listeners = [Attempt(ctx, zmq.SUB, at["pub"], public["key"], None, "subscribe")]
        pusher = Attempt(ctx, zmq.PUSH, at["tel"], public["key"], None, "push")
        for message in forged_telemetry():
            pusher.send(*message)
        listeners.append(pusher)
    askers = []
    for secret, op, body in asks:
        askers.append(Attempt(ctx, zmq.DEALER, at["ctl"], public["key"], secret, op))
        askers[-1].send(b"1", op.encode(), json.dumps(body).encode())
    out["attempts"] = attempt_all(askers + listeners, wait_s, until_each_answered=bool(secrets))
    ctx.term()
    return out


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1])))
