"""Helpers for the sniffing test: every frame on a lab's switch captured into a pcap file (a raw packet socket, no
tcpdump), TCP connections reassembled from it, and ZeroMQ's ZMTP 3 greeting and command names read from a stream.

The capture sits in the lab's switch namespace and takes each frame once, as it enters the bridge from a host's
port (a frame the bridge forwards is seen again leaving the other port: PACKET_OUTGOING, skipped), so what it holds
is exactly what crossed the hosts' cables. Traffic inside one host (node 0's front and its rank 0) never leaves it.
"""

from __future__ import annotations

import ctypes
import os
import socket
import struct
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

ETH_P_ALL = 0x0003
PACKET_OUTGOING = 4
SOL_PACKET, PACKET_STATISTICS = 263, 6
CLONE_NEWNET = 0x40000000
SNAPLEN = 1 << 18  # a veth carries GSO frames of up to 64 KiB: never cut one
_LIBC = ctypes.CDLL(None, use_errno=True)


def _setns(fd: int) -> None:
    if _LIBC.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns: {os.strerror(err)}")


def packet_socket(namespace: str) -> socket.socket:
    """A raw AF_PACKET socket on every interface of the named network namespace. Only the calling thread enters
    it (setns), and only for the socket() call: the socket stays bound to that namespace."""
    own = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    target = os.open(f"/run/netns/{namespace}", os.O_RDONLY)
    try:
        _setns(target)
        try:
            sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
        finally:
            _setns(own)
    finally:
        os.close(own)
        os.close(target)
    sock.setsockopt(socket.SOL_SOCKET, 33, 64 << 20)  # SO_RCVBUFFORCE (root): 64 MiB, so a burst is never dropped
    sock.settimeout(0.1)
    return sock


class Sniffer(threading.Thread):
    """Captures until `stop()`, each frame written to `path` (a pcap file, as tcpdump -w writes) as it comes: the
    file can be read while the capture goes on. `frames`: how many; `drops`: frames the kernel dropped for want of
    room in the socket (PACKET_STATISTICS)."""

    def __init__(self, namespace: str, path: Path, skip: tuple[str, ...] = ("br0",)):
        super().__init__(daemon=True, name="sniffer")
        self.sock = packet_socket(namespace)
        self.path, self.skip = path, skip
        self.frames = self.drops = 0
        self._done = threading.Event()

    def run(self) -> None:
        with open(self.path, "wb") as out:
            out.write(struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, SNAPLEN, 1))  # pcap, LINKTYPE_ETHERNET
            while not self._done.is_set():
                try:
                    data, (ifname, _, pkttype, _, _) = self.sock.recvfrom(SNAPLEN)
                except socket.timeout:
                    continue
                if pkttype == PACKET_OUTGOING or ifname in self.skip:
                    continue
                t = time.time()
                out.write(struct.pack("<IIII", int(t), int(t % 1 * 1e6), len(data), len(data)) + data)
                out.flush()
                self.frames += 1
            self._count_drops()
        self.sock.close()

    def _count_drops(self) -> None:
        _, drops = struct.unpack("II", self.sock.getsockopt(SOL_PACKET, PACKET_STATISTICS, 8))
        self.drops += drops

    def stop(self) -> None:
        self._done.set()
        self.join(timeout=10)


def read_pcap(path: Path) -> list[bytes]:
    """The frames of a pcap file (microsecond, little-endian, Ethernet: what Sniffer writes); a last record still
    being written is left out."""
    data = path.read_bytes()
    assert struct.unpack("<I", data[:4])[0] == 0xA1B2C3D4 and struct.unpack("<I", data[20:24])[0] == 1
    frames, i = [], 24
    while i + 16 <= len(data):
        size = struct.unpack("<I", data[i + 8:i + 12])[0]
        if i + 16 + size > len(data):
            break
        frames.append(data[i + 16:i + 16 + size])
        i += 16 + size
    return frames


@dataclass
class Connection:
    """One TCP connection: who opened it (client) and to which server, whether its SYN was captured, what each
    side sent (in order, without retransmissions) and the turns: [("c"|"s", bytes), ...] as the capture saw them."""

    client: tuple[str, int]
    server: tuple[str, int]
    syn: bool = False
    holes: bool = False  # a segment beyond what was seen of that side: the capture missed something
    turns: list[list] = field(default_factory=list)
    _next: dict[str, int | None] = field(default_factory=lambda: {"c": None, "s": None})

    def sent(self, way: str) -> bytes:
        return b"".join(data for w, data in self.turns if w == way)

    def add(self, way: str, seq: int, flags: int, payload: bytes) -> None:
        if flags & 0x02:  # SYN (or SYN-ACK): the data starts at seq + 1
            self._next[way] = (seq + 1) & 0xFFFFFFFF
            self.syn = self.syn or way == "c"
            return
        expected = self._next[way]
        if expected is None or not payload:
            return
        offset = (seq - expected) & 0xFFFFFFFF
        if offset >= 1 << 31:  # before what was taken: a retransmission, maybe overlapping new bytes
            payload = payload[(expected - seq) & 0xFFFFFFFF:]
        elif offset:
            self.holes = True
            return
        if not payload:
            return
        self._next[way] = (expected + len(payload)) & 0xFFFFFFFF
        if self.turns and self.turns[-1][0] == way:
            self.turns[-1][1] += payload
        else:
            self.turns.append([way, payload])


def connections(frames: list[bytes]) -> list[Connection]:
    """The TCP connections of IPv4 frames, in the order their first frame was seen."""
    found: dict[tuple, Connection] = {}
    for frame in frames:
        if len(frame) < 34 or frame[12:14] != b"\x08\x00" or frame[23] != 6:
            continue
        ihl = (frame[14] & 0x0F) * 4
        total = struct.unpack("!H", frame[16:18])[0]
        src, dst = socket.inet_ntoa(frame[26:30]), socket.inet_ntoa(frame[30:34])
        tcp = 14 + ihl
        sport, dport, seq = struct.unpack("!HHI", frame[tcp:tcp + 8])
        flags = frame[tcp + 13]
        payload = frame[tcp + (frame[tcp + 12] >> 4) * 4:14 + total]
        a, b = (src, sport), (dst, dport)
        if (a, b) in found:
            conn, way = found[(a, b)], "c"
        elif (b, a) in found:
            conn, way = found[(b, a)], "s"
        else:  # a connection seen first by its SYN-ACK (its SYN missed) is still keyed client first
            client_first = not (flags & 0x12 == 0x12)
            conn = found.setdefault((a, b) if client_first else (b, a),
                                    Connection(a, b) if client_first else Connection(b, a))
            way = "c" if client_first else "s"
        conn.add(way, seq, flags, payload)
    return list(found.values())


# -- ZeroMQ's wire (ZMTP 3, rfc.zeromq.org/spec/23; CURVE: spec/26) --------------------------------------------
SIGNATURE_HEAD, SIGNATURE_TAIL = 0xFF, 0x7F
GREETING = 64


def mechanism(stream: bytes) -> str | None:
    """The security mechanism a ZMTP 3 greeting names ("CURVE", "NULL", "PLAIN"), None if it is no greeting."""
    if len(stream) < GREETING or stream[0] != SIGNATURE_HEAD or stream[9] != SIGNATURE_TAIL or stream[10] != 3:
        return None
    return stream[12:32].rstrip(b"\0").decode("ascii", "replace")


def commands(stream: bytes) -> list[str]:
    """The names that open each frame after the greeting. Under CURVE every frame is a command (HELLO, WELCOME,
    INITIATE, READY, ERROR) or a MESSAGE box: its name is in clear, everything after it is encrypted. A last frame
    cut short is named with a `…`."""
    names, i = [], GREETING
    while i < len(stream):
        flags = stream[i]
        if flags & 0x02:
            size, head = (struct.unpack("!Q", stream[i + 1:i + 9])[0] if i + 9 <= len(stream) else 1 << 62), 9
        else:
            size, head = (stream[i + 1] if i + 1 < len(stream) else 1 << 62), 2
        body = stream[i + head:i + head + size]
        name = body[1:1 + body[0]].decode("ascii", "replace") if body else ""
        names.append(name if len(body) == size else name + "…")
        i += head + size
    return names
