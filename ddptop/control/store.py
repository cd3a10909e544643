"""Opening TCPStore connections with one-line errors instead of c10d tracebacks."""

from __future__ import annotations

import errno
import socket
from datetime import timedelta

import torch.distributed as dist

from ddptop.control import keys
from ddptop.errors import RendezvousError


def serve(port: int, host: str = "0.0.0.0") -> dist.TCPStore:
    """Host the job's store. TCPStore listens on every interface; `host` only names it in messages."""
    try:
        return dist.TCPStore(host, port, None, True, timedelta(seconds=30), wait_for_workers=False)
    except Exception as exc:  # c10d raises DistNetworkError / RuntimeError with multi-line text
        text = str(exc)
        if "EADDRINUSE" in text or "address already in use" in text.lower() or f"errno: {errno.EADDRINUSE}" in text:
            raise RendezvousError(f"port {port} is already in use on this machine: pick another with --port") from None
        raise RendezvousError(f"cannot listen on port {port}: {text.splitlines()[0]}") from None


def connect(host: str, port: int, timeout_s: float, source: str = "flags") -> dist.TCPStore:
    """A client connection; gives up after `timeout_s` with one line naming the address and where it came from."""
    try:
        return dist.TCPStore(host, port, None, False, timedelta(seconds=timeout_s))
    except Exception:
        raise RendezvousError(
            f"cannot reach the ddptop master at {host}:{port} (from {source}) after {timeout_s:g} s: "
            "is rank 0 running and the port open?"
        ) from None


def ddptop_view(store: dist.Store, attempt_prefix: str = "") -> dist.Store:
    return dist.PrefixStore(keys.DDPTOP_PREFIX + attempt_prefix, store)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]
