"""LiteStore (ddptop ctl's torch-free store client) against torch's own TCPStore servers, classic and libuv."""

from __future__ import annotations

import socket
from datetime import timedelta

import pytest
import torch.distributed as dist

from ddptop.control.litestore import LiteStore, StoreTimeout
from ddptop.errors import RendezvousError

import ports


@pytest.mark.parametrize("libuv", [False, True], ids=["classic", "libuv"])
def test_every_call_ddptop_makes_agrees_with_torchs_client(libuv):
    port = ports.port()
    server = dist.TCPStore("127.0.0.1", port, None, True, timedelta(seconds=10), wait_for_workers=False,
                           use_libuv=libuv)
    torch_view = dist.PrefixStore("ddptop/attempt_0", server)
    lite = LiteStore("127.0.0.1", port, 5.0, "ddptop/attempt_0")
    try:
        torch_view.set("ctl/status", '{"step": 3}')
        assert lite.get("ctl/status") == b'{"step": 3}'
        assert lite.check(["ctl/status"]) and not lite.check(["ctl/status", "nope"])
        assert lite.add("ctl/seq", 1) == 1 and torch_view.add("ctl/seq", 1) == 2 and lite.add("ctl/seq", 0) == 2
        lite.set("ctl/req/1", b"\x00\xffbytes")
        assert torch_view.get("ctl/req/1") == b"\x00\xffbytes"
        lite.multi_set(["a", "b"], [b"1", "2"])
        assert lite.multi_get(["a", "b", "ctl/status"]) == [b"1", b"2", b'{"step": 3}'] == \
            torch_view.multi_get(["a", "b", "ctl/status"])
        assert lite.delete_key("a") and not torch_view.check(["a"])
        with pytest.raises(StoreTimeout):
            lite.wait(["never"], timedelta(seconds=0.2))
        assert lite.get("b") == b"2"  # the connection is still in step after a timeout
    finally:
        lite.close()


def test_nothing_listening_and_not_a_store_are_one_line_each():
    with pytest.raises(RendezvousError, match="no ddptop job on 127.0.0.1:"):
        LiteStore("127.0.0.1", ports.port(), 2.0)
    with socket.socket() as other:  # something that accepts and answers nonsense
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        import threading

        def answer():
            conn, _ = other.accept()
            conn.recv(64)
            conn.sendall(b"HTTP/1.1 400\r\n")
            conn.close()

        threading.Thread(target=answer, daemon=True).start()
        with pytest.raises((RendezvousError, ConnectionError)):
            LiteStore("127.0.0.1", port, 2.0)
