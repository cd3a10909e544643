"""The job's own channel: an authenticated key-value server the front hosts, and its client (plain Python, no torch).

torch's TCPStore answers anyone who reaches its port, and since torch 2.x `list_keys()` shows every key to them:
a stranger could read, freeze, delete or replay anything ddptop kept there. So after the join, ddptop's own traffic
(telemetry, heartbeats, requests, answers, status) goes here instead; the store keeps only torch's rendezvous and
the public join keys (README: trust model).

Why this transport: Python 3.11's `ssl` has no pre-shared-key ciphers, and a certificate would need a CA the ranks
and `ctl` share; every party already shares a key (auth.JobKeys), so a TCP stream framed with HMAC-SHA256 is enough.
Nothing here is secret from a network reader (no encryption): what matters is that nobody without the key can
change, drop, reorder or replay a frame, or talk to the server at all.

Handshake (both ways): client -> MAGIC, role, nonce_c; server -> nonce_s, HMAC(K, "server"|nc|ns); client ->
HMAC(K, "client"|nc|ns). K is the role's key: `control` (ctl, attach, the front) or `ranks` (ranks started
without the token). Session key = HMAC(K, "session"|nc|ns). Each frame: 4-byte length, payload,
HMAC(session, direction|counter|payload) with an implicit per-direction counter: a frame replayed, reordered,
dropped or spliced from another connection fails its MAC and the connection is closed.

Bounds: MAX_PENDING connections may be unauthenticated at once (beyond that the oldest is dropped and counted, so
a client that proves the key within milliseconds gets through a flood of idle connections), a
handshake has HANDSHAKE_S, a frame once begun has FRAME_S, a frame is at most MAX_FRAME bytes, and the server holds
at most max_bytes in all (a write past it is refused and counted): nothing a stranger or a stalled peer does
stalls the job or grows the front unreported (`stats`, which Liveness turns into one line).
"""

from __future__ import annotations

import collections
import hashlib
import hmac
import os
import socket
import struct
import threading
import time
from datetime import timedelta
from typing import Sequence

from ddptop.control import keys
from ddptop.errors import RendezvousError

MAGIC = b"ddptopC1"
ROLES = (b"control", b"ranks")
NONCE = 16
MAC = 32
HANDSHAKE_S = 5.0  # a peer that has not proved the key by then is dropped
FRAME_S = 10.0  # a frame begun must be complete within this: a half-sent frame costs its connection only
MAX_PENDING = 32  # unauthenticated connections at once; a flood beyond it is closed on accept
MAX_CONNECTIONS = 1024  # authenticated ones (each rank has 2, each collector 2, each ctl 1)
MAX_FRAME = 9 << 20  # a request: a multi_set of one 4 MiB batch and its head, with room
MAX_REPLY = 160 << 20  # an answer: a collector's multi_get of 32 batches of 4 MiB at most (bus.MAX_READ)
MAX_HELD = 512 << 20  # bytes of keys and values held: 2 ranks write ~1 MiB a minute; the cap is for a runaway
POLL_S = 0.02

SET, GET, ADD, CHECK, MULTI_GET, MULTI_SET, DELETE, NUM_KEYS, STATS = range(1, 10)
OK, MISSING, REFUSED = 0, 1, 2


class ChannelError(RendezvousError):
    """The channel refused, timed out or could not be authenticated: one line, exit 4."""


class ChannelTimeout(ChannelError, TimeoutError):
    pass


class ChannelRefused(ChannelError):
    """The handshake failed: the peer did not prove the key (a wrong token, or not the job's channel)."""


# -- framing (both sides) ------------------------------------------------------------------------------------------
def pack(parts: Sequence[bytes]) -> bytes:
    return struct.pack(">I", len(parts)) + b"".join(struct.pack(">I", len(p)) + p for p in parts)


def unpack(payload: bytes) -> list[bytes]:
    if len(payload) < 4:
        raise ValueError("short payload")
    count, at, out = struct.unpack_from(">I", payload)[0], 4, []
    for _ in range(count):
        if at + 4 > len(payload):
            raise ValueError("short payload")
        size = struct.unpack_from(">I", payload, at)[0]
        at += 4
        if at + size > len(payload):
            raise ValueError("short payload")
        out.append(payload[at:at + size])
        at += size
    if at != len(payload):
        raise ValueError("trailing bytes")
    return out


def _mac(key: bytes, *parts: bytes) -> bytes:
    return hmac.new(key, b"\0".join(parts), hashlib.sha256).digest()


def _recv(sock: socket.socket, n: int, deadline: float | None) -> bytes:
    """`n` bytes by `deadline` (None: however long it takes: an idle authenticated peer stays connected)."""
    out = bytearray()
    if deadline is None:
        sock.settimeout(None)
    while len(out) < n:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise socket.timeout("deadline")
            sock.settimeout(left)
        chunk = sock.recv(min(n - len(out), 1 << 20))
        if not chunk:
            raise ConnectionError("closed")
        out += chunk
    return bytes(out)


class _Framed:
    """One authenticated connection's frames: `out`/`into` name the directions (b"c" client->server, b"s" back)."""

    def __init__(self, sock: socket.socket, session: bytes, out: bytes, into: bytes):
        self.sock, self.session, self.out, self.into = sock, session, out, into
        self.sent = self.received = 0

    def send(self, payload: bytes) -> None:
        tag = _mac(self.session, self.out, struct.pack(">Q", self.sent), payload)
        self.sent += 1
        self.sock.sendall(struct.pack(">I", len(payload)) + payload + tag)

    def recv(self, first_wait: float | None, frame_s: float, cap: int = MAX_FRAME) -> bytes:
        """A frame of at most `cap` bytes: wait up to `first_wait` (None: forever) for its first bytes, then
        `frame_s` for the rest."""
        head = _recv(self.sock, 4, None if first_wait is None else time.monotonic() + first_wait)
        deadline = time.monotonic() + frame_s
        size = struct.unpack(">I", head)[0]
        if size > cap:
            raise ValueError(f"a frame of {size} bytes is over the {cap}-byte cap")
        payload = _recv(self.sock, size, deadline)
        tag = _recv(self.sock, MAC, deadline)
        if not hmac.compare_digest(tag, _mac(self.session, self.into, struct.pack(">Q", self.received), payload)):
            raise ValueError("a frame failed its MAC: altered, replayed, reordered or from another connection")
        self.received += 1
        return payload


# -- server --------------------------------------------------------------------------------------------------------
class ChannelServer:
    """Threaded: one thread per connection, a dict under a lock. `keys` maps a role (b"control", b"ranks") to its key."""

    def __init__(self, host: str, keys: dict[bytes, bytes], port: int = 0, max_bytes: int = MAX_HELD):
        self.keys = {role: key for role, key in keys.items() if key}
        self.max_bytes = max_bytes
        self.data: dict[bytes, bytes] = {}
        self.held = 0
        self.counts = {"refused_writes": 0, "flooded": 0, "failed_handshakes": 0, "bad_frames": 0}
        self._lock = threading.Lock()
        self._pending: collections.deque[socket.socket] = collections.deque()  # not authenticated yet, oldest first
        self._open = 0
        self._closed = False
        self.sock = _listen(host, port)
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._accept, name="ddptop-channel", daemon=True).start()

    def close(self) -> None:
        self._closed = True
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                if self._closed:
                    return
                time.sleep(0.05)  # out of file descriptors: the flood passes, the job goes on
                continue
            with self._lock:
                if self._open >= MAX_CONNECTIONS:
                    self.counts["flooded"] += 1
                    conn.close()
                    continue
                if len(self._pending) >= MAX_PENDING:  # a flood: the oldest waiter goes, so a real client that
                    self.counts["flooded"] += 1  # proves the key within milliseconds still gets through
                    _drop(self._pending.popleft())
                self._pending.append(conn)
            threading.Thread(target=self._serve, args=(conn,), name="ddptop-channel-conn", daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            framed = self._handshake(conn)
            self._settled(conn)
            if framed is None:
                with self._lock:
                    self.counts["failed_handshakes"] += 1
                return
            with self._lock:
                self._open += 1
            try:
                while True:
                    framed.send(self._answer(unpack(framed.recv(None, FRAME_S))))
            except (ValueError, struct.error):
                with self._lock:
                    self.counts["bad_frames"] += 1
            finally:
                with self._lock:
                    self._open -= 1
        except (OSError, ConnectionError):
            pass
        finally:
            self._settled(conn)
            conn.close()

    def _settled(self, conn: socket.socket) -> None:
        with self._lock:
            try:
                self._pending.remove(conn)
            except ValueError:  # settled already, or dropped by a flood
                pass

    def _handshake(self, conn: socket.socket) -> _Framed | None:
        deadline = time.monotonic() + HANDSHAKE_S
        try:
            hello = _recv(conn, len(MAGIC) + 1 + NONCE, deadline)
        except (OSError, ConnectionError):
            return None
        role = ROLES[hello[len(MAGIC)]] if hello[len(MAGIC)] < len(ROLES) else None
        if hello[:len(MAGIC)] != MAGIC or role not in self.keys:
            return None
        key, nc, ns = self.keys[role], hello[-NONCE:], os.urandom(NONCE)
        conn.sendall(ns + _mac(key, b"server", nc, ns))
        try:
            proof = _recv(conn, MAC, deadline)
        except (OSError, ConnectionError):
            return None
        if not hmac.compare_digest(proof, _mac(key, b"client", nc, ns)):
            return None
        conn.settimeout(None)
        return _Framed(conn, _mac(key, b"session", nc, ns), b"s", b"c")

    def _answer(self, parts: list[bytes]) -> bytes:
        op, args = parts[0][0] if parts and parts[0] else 0, parts[1:]
        with self._lock:
            if op == SET:
                return pack([bytes([self._put([(args[0], args[1])])])])
            if op == MULTI_SET:
                return pack([bytes([self._put(list(zip(args[0::2], args[1::2])))])])
            if op == GET:
                value = self.data.get(args[0])
                return pack([bytes([MISSING])] if value is None else [bytes([OK]), value])
            if op == MULTI_GET:
                values = [self.data.get(k) for k in args]
                if any(v is None for v in values):
                    return pack([bytes([MISSING])])
                return pack([bytes([OK]), *values])
            if op == CHECK:
                return pack([bytes([OK if all(k in self.data for k in args) else MISSING])])
            if op == ADD:
                return pack([bytes([OK]), str(self._add(args[0], int(args[1]))).encode()])
            if op == DELETE:
                value = self.data.pop(args[0], None)
                if value is not None:
                    self.held -= len(args[0]) + len(value)
                return pack([bytes([OK if value is not None else MISSING])])
            if op == NUM_KEYS:
                return pack([bytes([OK]), str(len(self.data)).encode()])
            if op == STATS:
                return pack([bytes([OK]), str(self.held).encode(), *(str(v).encode() for v in self.counts.values())])
        raise ValueError(f"unknown operation {op}")

    def _put(self, items: list[tuple[bytes, bytes]]) -> int:
        grows = sum(len(k) + len(v) - (len(k) + len(self.data[k]) if k in self.data else 0) for k, v in items)
        if self.held + grows > self.max_bytes:
            self.counts["refused_writes"] += 1
            return REFUSED
        for k, v in items:
            self.data[k] = v
        self.held += grows
        return OK

    def _add(self, key: bytes, amount: int) -> int:
        try:
            value = int(self.data.get(key, b"0")) + amount
        except ValueError:
            raise ValueError("add on a value that is not a number") from None
        self._put([(key, str(value).encode())])
        return value


def _drop(conn: socket.socket) -> None:
    """End a waiting connection: its thread's recv returns at once and the thread exits."""
    try:
        conn.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


def _listen(host: str, port: int) -> socket.socket:
    """On the store's address (store.serve's rule): a name that is not this machine's listens on every interface."""
    try:
        family, _, _, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.bind(address)
        except OSError:
            sock.close()
            raise
    except OSError:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("0.0.0.0", port))
    sock.listen(256)
    return sock


# -- client --------------------------------------------------------------------------------------------------------
class ChannelClient:
    """The Store calls ddptop's control code makes (set, get, add, check, wait, multi_get, multi_set, delete_key,
    num_keys), over one authenticated connection. Thread-safe (one request at a time)."""

    def __init__(self, host: str, port: int, key: bytes, role: bytes = b"control", timeout_s: float = 10.0):
        self.where, self.timeout_s = f"{host}:{port}", timeout_s
        self._lock = threading.Lock()
        try:
            self.sock = socket.create_connection((host, port), timeout=timeout_s)
        except OSError as exc:
            raise ChannelError(f"cannot reach the job's channel at {self.where}: {exc.strerror or exc}") from None
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            self.framed = self._handshake(key, role)
        except BaseException:
            self.sock.close()
            raise

    def _handshake(self, key: bytes, role: bytes) -> _Framed:
        nc = os.urandom(NONCE)
        deadline = time.monotonic() + self.timeout_s
        try:
            self.sock.sendall(MAGIC + bytes([ROLES.index(role)]) + nc)
            answer = _recv(self.sock, NONCE + MAC, deadline)
        except (OSError, ConnectionError):
            raise ChannelRefused(f"the channel at {self.where} did not answer the handshake: a wrong token, or "
                                 "not a ddptop job's channel") from None
        ns = answer[:NONCE]
        if not hmac.compare_digest(answer[NONCE:], _mac(key, b"server", nc, ns)):
            raise ChannelRefused(f"the channel at {self.where} could not prove it knows the job key: a wrong token, "
                               "or someone else's server") from None
        self.sock.sendall(_mac(key, b"client", nc, ns))
        return _Framed(self.sock, _mac(key, b"session", nc, ns), b"c", b"s")

    def _call(self, op: int, *args: bytes) -> list[bytes]:
        with self._lock:
            try:
                self.framed.send(pack([bytes([op]), *args]))
                return unpack(self.framed.recv(self.timeout_s, self.timeout_s, MAX_REPLY))
            except socket.timeout:
                raise ChannelTimeout(f"the job's channel at {self.where} did not answer in time") from None
            except (OSError, ConnectionError, ValueError, struct.error) as exc:
                raise ChannelError(f"the job's channel at {self.where} went away ({exc})") from None

    @staticmethod
    def _b(value: bytes | str) -> bytes:
        return value.encode() if isinstance(value, str) else bytes(value)

    def set(self, key: str, value: bytes | str) -> None:
        self.multi_set([key], [value])

    def multi_set(self, keys: Sequence[str], values: Sequence[bytes | str]) -> None:
        args = [self._b(x) for pair in zip(keys, values) for x in pair]
        if self._call(MULTI_SET, *args)[0][0] != OK:
            raise ChannelError(f"the job's channel at {self.where} is full: write refused")

    def get(self, key: str) -> bytes:
        self.wait([key])
        answer = self._call(GET, self._b(key))
        if answer[0][0] != OK:
            raise ChannelError(f"key {key} vanished from the job's channel")
        return answer[1]

    def multi_get(self, keys: Sequence[str]) -> list[bytes]:
        self.wait(keys)
        answer = self._call(MULTI_GET, *(self._b(k) for k in keys))
        if answer[0][0] != OK:
            raise ChannelError("keys vanished from the job's channel")
        return answer[1:]

    def check(self, keys: Sequence[str]) -> bool:
        return self._call(CHECK, *(self._b(k) for k in keys))[0][0] == OK

    def wait(self, keys: Sequence[str], timeout: timedelta | None = None) -> None:
        deadline = time.monotonic() + (timeout.total_seconds() if timeout else self.timeout_s)
        while not self.check(keys):
            if time.monotonic() > deadline:
                raise ChannelTimeout(f"keys {list(keys)} not set within the timeout")
            time.sleep(POLL_S)

    def add(self, key: str, amount: int) -> int:
        answer = self._call(ADD, self._b(key), str(int(amount)).encode())
        return int(answer[1])

    def delete_key(self, key: str) -> bool:
        return self._call(DELETE, self._b(key))[0][0] == OK

    def num_keys(self) -> int:
        return int(self._call(NUM_KEYS)[1])

    def stats(self) -> dict[str, int]:
        """Bytes held and what the server refused: writes past its cap, floods, failed handshakes, bad frames."""
        answer = self._call(STATS)[1:]
        return dict(zip(("held", "refused_writes", "flooded", "failed_handshakes", "bad_frames"),
                        (int(v) for v in answer)))

    def close(self) -> None:
        """Ends the connection; a call blocked on it in another thread returns at once with ChannelError."""
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()


# -- where the channel is: two public store keys (keys.SALT, keys.CHANNEL) --------------------------------------------
def read_salt(public, timeout_s: float) -> bytes:
    """The job's salt from the store's public keys, waiting up to `timeout_s` for whoever hosts the front."""
    raw = _wait_public(public, keys.SALT, timeout_s, "salt")
    try:
        salt = bytes.fromhex(raw.decode("ascii"))
    except (UnicodeDecodeError, ValueError):
        salt = b""
    if not 8 <= len(salt) <= keys.MAX_PUBLIC_BYTES:
        raise ChannelError("the job's salt in the store is malformed: someone else on its port overwrote it")
    return salt


def read_port(public, timeout_s: float) -> int:
    raw = _wait_public(public, keys.CHANNEL, timeout_s, "channel port")
    try:
        port = int(raw.decode("ascii"))
    except (UnicodeDecodeError, ValueError):
        port = 0
    if not 1 <= port <= 65535:
        raise ChannelError("the job's channel port in the store is malformed: someone else on its port overwrote it")
    return port


def _wait_public(public, key: str, timeout_s: float, what: str) -> bytes:
    deadline = time.monotonic() + timeout_s
    while not public.check([key]):
        if time.monotonic() > deadline:
            raise ChannelTimeout(f"the job's {what} did not appear in its store within {timeout_s:g} s: "
                                 "is its front (or rank 0) running?")
        time.sleep(0.05)
    raw = public.get(key)
    if len(raw) > keys.MAX_PUBLIC_BYTES * 2:
        raise ChannelError(f"the job's {what} in the store is malformed: someone else on its port overwrote it")
    return bytes(raw)


def publish(public, salt: bytes | None = None, port: int | None = None) -> None:
    if salt is not None:
        public.set(keys.SALT, salt.hex())
    if port is not None:
        public.set(keys.CHANNEL, str(port))
