"""Provides LiteStore: a TCPStore client in plain Python, so `ddptop ctl` and `attach` talk to a job without torch.

Importing torch takes 2-10 s on a busy node; `ddptop ctl status` needs four store calls. This speaks c10d's
TCPStore wire protocol (torch/csrc/distributed/c10d/store/TCPStoreBackend.hpp: a validation magic, then one
query byte and length-prefixed strings, all little-endian; every key starts with `/`), which both of torch's servers (libuv and the classic
one) answer; tests check it against torch's own TCPStore. Only the calls ddptop's clients make are here.
"""

from __future__ import annotations

import socket
import struct
import time
from datetime import timedelta
from typing import Sequence

from ddptop.errors import RendezvousError

MAGIC = 0x3C85F7CE  # validationMagicNumber
VALIDATE, SET, GET, ADD, CHECK, WAIT, DELETE_KEY, MULTI_GET, MULTI_SET, PING = 0, 1, 3, 4, 5, 6, 8, 10, 11, 13
READY = 0  # CheckResponseType
MAX_VALUE = 64 << 20  # a value bigger than this is not ddptop's: refuse rather than allocate it


class StoreTimeout(TimeoutError):
    pass


class LiteStore:
    """The subset of torch.distributed.Store that ddptop's clients use: set, get, add, check, wait, multi_get,
    multi_set, delete_key. Keys are str, values bytes (str is encoded)."""

    def __init__(self, host: str, port: int, timeout_s: float = 5.0, prefix: str = ""):
        self.prefix, self.timeout_s = prefix, timeout_s
        self.sock = _connect(host, port, timeout_s)
        self._send(struct.pack("<BI", VALIDATE, MAGIC))
        nonce = int(time.time() * 1000) & 0xFFFFFFFF
        self._send(struct.pack("<BI", PING, nonce))  # torch's client pings too: an answer proves it is a store
        if struct.unpack("<I", self._recv(4))[0] != nonce:
            raise RendezvousError(f"{host}:{port} is not a ddptop job's store (it answered, but not as one)")

    # -- the Store calls ----------------------------------------------------------------------------------
    def set(self, key: str, value: bytes | str) -> None:
        self._send(bytes([SET]) + self._str(key) + _blob(value))

    def get(self, key: str) -> bytes:
        self.wait([key])
        self._send(bytes([GET]) + self._str(key))
        return self._blob_in()

    def add(self, key: str, amount: int) -> int:
        self._send(bytes([ADD]) + self._str(key) + struct.pack("<q", amount))
        return struct.unpack("<q", self._recv(8))[0]

    def check(self, keys: Sequence[str]) -> bool:
        self._send(bytes([CHECK]) + struct.pack("<Q", len(keys)) + b"".join(self._str(k) for k in keys))
        return self._recv(1)[0] == READY

    def wait(self, keys: Sequence[str], timeout: timedelta | None = None) -> None:
        """Poll `check` rather than WAIT: a WAIT cannot be abandoned without a cancel round trip."""
        deadline = time.monotonic() + (timeout.total_seconds() if timeout else self.timeout_s)
        while not self.check(keys):
            if time.monotonic() > deadline:
                raise StoreTimeout(f"keys {list(keys)} not set within the timeout")
            time.sleep(0.02)

    def multi_get(self, keys: Sequence[str]) -> list[bytes]:
        self.wait(keys)
        self._send(bytes([MULTI_GET]) + struct.pack("<Q", len(keys)) + b"".join(self._str(k) for k in keys))
        return [self._blob_in() for _ in keys]

    def multi_set(self, keys: Sequence[str], values: Sequence[bytes | str]) -> None:
        body = b"".join(self._str(k) + _blob(v) for k, v in zip(keys, values))
        self._send(bytes([MULTI_SET]) + struct.pack("<Q", len(keys)) + body)

    def delete_key(self, key: str) -> bool:
        self._send(bytes([DELETE_KEY]) + self._str(key))
        return struct.unpack("<q", self._recv(8))[0] > 0

    def close(self) -> None:
        self.sock.close()

    # -- wire -------------------------------------------------------------------------------------------
    def _str(self, key: str) -> bytes:
        """TCPStore puts `/` before every key on the wire (its keyPrefix_); PrefixStore joins with `/`."""
        return _blob("/" + (f"{self.prefix}/{key}" if self.prefix else key))

    def _send(self, data: bytes) -> None:
        try:
            self.sock.sendall(data)
        except OSError as exc:
            raise ConnectionError(f"the job's store went away: {exc.strerror or exc}") from None

    def _recv(self, n: int) -> bytes:
        out = bytearray()
        while len(out) < n:
            try:
                chunk = self.sock.recv(n - len(out))
            except socket.timeout:
                raise StoreTimeout("the job's store did not answer in time") from None
            except OSError as exc:
                raise ConnectionError(f"the job's store went away: {exc.strerror or exc}") from None
            if not chunk:
                raise ConnectionError("the job's store closed the connection")
            out += chunk
        return bytes(out)

    def _blob_in(self) -> bytes:
        size = struct.unpack("<Q", self._recv(8))[0]
        if size > MAX_VALUE:
            raise ConnectionError(f"the store sent a value of {size} bytes: not a ddptop job's")
        return self._recv(size)


def _blob(value: bytes | str) -> bytes:
    data = value.encode() if isinstance(value, str) else bytes(value)
    return struct.pack("<Q", len(data)) + data


def _connect(host: str, port: int, timeout_s: float) -> socket.socket:
    """One line when nothing listens: `no ddptop job on HOST:PORT` (refused at once) or unreachable (timeout)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            sock = socket.create_connection((host, port), timeout=max(0.1, deadline - time.monotonic()))
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.settimeout(timeout_s)
            return sock
        except ConnectionRefusedError:
            raise RendezvousError(f"no ddptop job on {host}:{port}: nothing listens there "
                                  "(is the job running, and is that its --port?)") from None
        except socket.gaierror as exc:
            raise RendezvousError(f"cannot resolve {host}: {exc.strerror or exc}") from None
        except OSError as exc:
            if time.monotonic() >= deadline:
                raise RendezvousError(f"cannot reach {host}:{port} within {timeout_s:g} s: "
                                      f"{exc.strerror or 'timed out'}") from None
            time.sleep(0.1)


def connect(host: str, port: int, timeout_s: float, prefix: str = "") -> LiteStore:
    """A client view like stores.ddptop_view(stores.connect(...)): keys under `prefix` (e.g. `ddptop`)."""
    return LiteStore(host, port, timeout_s, prefix)
