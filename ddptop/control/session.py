"""Provides Session, the one request/reply wrapper every client of the front uses, and the public join keys.

A Session is a DEALER socket to the front's ROUTER (transport.Server's `ctl`). Each request carries a fresh id and
its reply echoes it; a reply with another id (a late answer to a call that timed out) is dropped, and a call that
times out closes its socket, so the next call starts on a fresh one: a late reply can never be taken for the
answer to another call. JSON both ways, never pickle.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from typing import Any, NoReturn

import zmq

from ddptop.control import keys, transport
from ddptop.control.auth import JobKeys
from ddptop.errors import RendezvousError


class SessionError(RendezvousError):
    """The front refused, did not answer in time, or answered what is not a reply: one line, exit 4."""


class SessionTimeout(SessionError, TimeoutError):
    pass


class SessionRefused(SessionError):
    """CURVE's handshake failed: the peer does not hold this job's key for us (a wrong token), or refused ours."""


FAILED = zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_AUTH


class Session:
    """Thread-safe (one call at a time). `role`: ctl, attach or agent (transport.ROLES)."""

    def __init__(self, host: str, port: int, job: JobKeys, role: str = "ctl", timeout_s: float = 10.0):
        self.host, self.port, self.job, self.role, self.timeout_s = host, port, job, role, timeout_s
        self.where = f"{host}:{port}"
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._sock: zmq.Socket | None = None

    def call(self, op: str, body: dict[str, Any] | None = None, timeout_s: float | None = None) -> dict[str, Any]:
        """The front's reply to `op`, or SessionError (refused, malformed) / SessionTimeout."""
        with self._lock:
            self._open()
            request_id = str(next(self._ids)).encode()
            deadline = time.monotonic() + (timeout_s or self.timeout_s)
            try:
                self._send([request_id, op.encode(), json.dumps(body or {}).encode()], deadline)
                return self._reply(request_id, deadline)
            except (SessionTimeout, SessionRefused):
                self._drop()  # a late reply goes with the socket
                raise

    def _open(self) -> None:
        if self._sock is None:
            self._sock = transport.client_socket(zmq.DEALER, self.job, self.role,
                                                 transport.endpoint(self.host, self.port))
            self._monitor = self._sock.get_monitor_socket(FAILED)

    def _send(self, frames: list[bytes], deadline: float) -> None:
        """Send within the deadline. A handshake that already failed has dropped the socket's only pipe, and a
        DEALER with no pipe blocks a send for ever: that is a refusal said at once, and a send that cannot leave
        by the deadline is a timeout, never a hang."""
        if self._monitor.poll(0):
            self._refused()
        self._sock.setsockopt(zmq.SNDTIMEO, max(1, int((deadline - time.monotonic()) * 1000)))
        try:
            self._sock.send_multipart(frames)
        except zmq.Again:
            if self._monitor.poll(0):
                self._refused()
            raise self._timeout() from None

    def _refused(self) -> NoReturn:
        self._monitor.recv_multipart()
        raise SessionRefused(f"the job's front at {self.where} refused this {self.role}'s key, or could not "
                             "prove its own: a wrong token, or not this job's front")

    def _timeout(self) -> SessionTimeout:
        return SessionTimeout(f"the job's front at {self.where} did not answer within {self.timeout_s:g} s "
                              "(stopped, or gone)")

    def _reply(self, request_id: bytes, deadline: float) -> dict[str, Any]:
        poller = zmq.Poller()
        poller.register(self._sock, zmq.POLLIN)
        poller.register(self._monitor, zmq.POLLIN)
        while True:
            left = deadline - time.monotonic()
            ready = dict(poller.poll(max(1, int(left * 1000)))) if left > 0 else {}
            if self._monitor in ready:
                self._refused()
            if self._sock not in ready:
                raise self._timeout()
            parts = self._sock.recv_multipart()
            if len(parts) != 2 or parts[0] != request_id:
                continue  # an answer to an earlier call: never taken for this one's
            try:
                reply = json.loads(parts[1])
            except (ValueError, RecursionError):
                raise SessionError(f"the job's front at {self.where} answered what is not JSON") from None
            if not isinstance(reply, dict):
                raise SessionError(f"the job's front at {self.where} answered what is not a JSON object")
            if reply.get("error"):
                raise SessionError(f"the job's front refused: {str(reply['error'])[:200]}")
            return reply

    def _drop(self) -> None:
        if self._sock is not None:
            self._sock.disable_monitor()
            self._monitor.close(linger=0)
            self._sock.close(linger=0)
            self._sock = None

    def close(self) -> None:
        with self._lock:
            self._drop()


# -- where the front is: two public store keys (keys.SALT, keys.CHANNEL) ----------------------------------------
def publish(public, salt: bytes | None = None, endpoints: dict | None = None) -> None:
    if salt is not None:
        public.set(keys.SALT, salt.hex())
    if endpoints is not None:
        public.set(keys.CHANNEL, json.dumps(endpoints, sort_keys=True))


def read_salt(public, timeout_s: float) -> bytes:
    """The job's salt from the store's public keys, waiting up to `timeout_s` for whoever hosts the front."""
    raw = _wait_public(public, keys.SALT, timeout_s, "salt")
    try:
        salt = bytes.fromhex(raw.decode("ascii"))
    except (UnicodeDecodeError, ValueError):
        salt = b""
    if not 8 <= len(salt) <= keys.MAX_PUBLIC_BYTES:
        raise SessionError("the job's salt in the store is malformed: someone else on its port overwrote it")
    return salt


def read_endpoints(public, timeout_s: float) -> dict:
    """{"tel", "ctl", "pub": ports, "key": the server's public key (z85)}; clients with the token use the key
    they derive (a forged one only points them at a server that cannot prove it)."""
    raw = _wait_public(public, keys.CHANNEL, timeout_s, "front's ports")
    try:
        value = json.loads(raw)
        ports = {name: value[name] for name in transport.DOMAINS}
        ok = all(isinstance(p, int) and 1 <= p <= 65535 for p in ports.values()) and isinstance(value["key"], str)
    except (ValueError, KeyError, TypeError, RecursionError):
        ok = False
    if not ok:
        raise SessionError("the job's ports in the store are malformed: someone else on its port overwrote them")
    return {**ports, "key": value["key"]}


def _wait_public(public, key: str, timeout_s: float, what: str) -> bytes:
    deadline = time.monotonic() + timeout_s
    while not public.check([key]):
        if time.monotonic() > deadline:
            raise SessionTimeout(f"the job's {what} did not appear in its store within {timeout_s:g} s: "
                                 "is its front (or rank 0) running?")
        time.sleep(0.05)
    raw = public.get(key)
    if len(raw) > keys.MAX_PUBLIC_BYTES * 4:
        raise SessionError(f"the job's {what} in the store is malformed: someone else on its port overwrote it")
    return bytes(raw)
