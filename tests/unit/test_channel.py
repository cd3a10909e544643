"""The job's channel against a real server socket: a wrong key gets nothing either way, and a frame replayed, reordered
or spliced from another connection is never applied (the server drops the connection and counts it)."""

from __future__ import annotations

import os
import socket
import struct

import pytest

from ddptop.control import channel
from ddptop.control.channel import ChannelClient, ChannelRefused, ChannelServer

KEY = b"k" * 32


@pytest.fixture
def server():
    served = ChannelServer("127.0.0.1", {b"control": KEY})
    yield served
    served.close()


def raw_session(port: int) -> tuple[socket.socket, channel._Framed]:
    """A client's handshake by hand, keeping the socket and its framing to misuse."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    nc = os.urandom(channel.NONCE)
    sock.sendall(channel.MAGIC + b"\0" + nc)
    answer = channel._recv(sock, channel.NONCE + channel.MAC, None)
    ns = answer[:channel.NONCE]
    sock.sendall(channel._mac(KEY, b"client", nc, ns))
    return sock, channel._Framed(sock, channel._mac(KEY, b"session", nc, ns), b"c", b"s")


def stats(server: ChannelServer) -> dict:
    return ChannelClient("127.0.0.1", server.port, KEY).stats()


def test_a_wrong_key_is_refused_and_counted_and_reads_nothing(server):
    ChannelClient("127.0.0.1", server.port, KEY).set("secret", b"1")
    with pytest.raises(ChannelRefused, match="could not prove it knows the job key"):
        ChannelClient("127.0.0.1", server.port, b"x" * 32)
    assert stats(server)["failed_handshakes"] == 1


def test_a_replayed_or_reordered_frame_is_never_applied(server):
    sock, framed = raw_session(server.port)
    request = channel.pack([bytes([channel.ADD]), b"n", b"1"])
    framed.send(request)
    framed.recv(5, 5, channel.MAX_REPLY)
    wire = struct.pack(">I", len(request)) + request + channel._mac(framed.session, b"c", struct.pack(">Q", 0), request)
    sock.sendall(wire)  # the same bytes again: counter 0 is spent
    with pytest.raises((ConnectionError, OSError)):
        framed.recv(5, 5, channel.MAX_REPLY)
    other, second = raw_session(server.port)
    other.sendall(wire)  # spliced into another connection: another session key
    with pytest.raises((ConnectionError, OSError)):
        second.recv(5, 5, channel.MAX_REPLY)
    client = ChannelClient("127.0.0.1", server.port, KEY)
    assert client.add("n", 0) == 1 and stats(server)["bad_frames"] == 2


def test_an_oversized_frame_costs_its_connection_only(server):
    sock, _ = raw_session(server.port)
    sock.sendall(struct.pack(">I", channel.MAX_FRAME + 1))
    assert sock.recv(1) == b""  # dropped before anything that size is read
    client = ChannelClient("127.0.0.1", server.port, KEY)
    client.set("a", b"x")
    assert client.get("a") == b"x" and stats(server)["bad_frames"] == 1
