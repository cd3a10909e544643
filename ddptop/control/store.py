"""Opening TCPStore connections with one-line errors instead of c10d tracebacks."""

from __future__ import annotations

import errno
import os
import socket
import sys
from datetime import timedelta

import torch.distributed as dist

from ddptop.control import keys
from ddptop.errors import RendezvousError
from ddptop.rendezvous import check_host as resolve  # noqa: F401  (the master's name, before any connect)


def serve(port: int, host: str = "127.0.0.1") -> dist.TCPStore:
    """Host the job's store, listening on `host`'s address only (TCPStore alone would listen on every interface).

    We bind the socket ourselves and hand it to TCPStore's libuv server: an event loop that serves every
    other client while one sends half a message and stalls (torch's older server blocked on it for ~75 s),
    and refuses any value over 8 MiB without storing it. A master name that is not an address of this
    machine (NAT, a cluster alias) falls back to all interfaces.
    """
    resolve(host, port)
    try:
        sock = _listen(host, port)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise RendezvousError(f"port {port} is already in use on this machine: pick another with --port") from None
        if exc.errno not in (errno.EADDRNOTAVAIL, errno.EINVAL) and not isinstance(exc, socket.gaierror):
            raise RendezvousError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
        print(f"ddptop: {host} is not an address of this machine; the store listens on every interface",
              file=sys.stderr)
        try:
            sock = _listen("0.0.0.0", port)
        except OSError as again:
            raise RendezvousError(f"cannot listen on port {port}: {again.strerror or again}") from None
    fd = sock.detach()  # the store's daemon owns the socket from now on and closes it
    try:
        return dist.TCPStore(host, sock_port(fd), None, True, timedelta(seconds=30), wait_for_workers=False,
                             master_listen_fd=fd, use_libuv=True)
    except Exception as exc:  # c10d errors are multi-line
        try:
            os.close(fd)
        except OSError:  # the store had closed it already
            pass
        raise RendezvousError(f"cannot start the store on port {port}: {str(exc).splitlines()[0]}") from None


def _listen(host: str, port: int) -> socket.socket:
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    family, _, _, _, address = infos[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # the port is free again right after a run
        sock.bind(address)
        sock.listen(1024)
    except OSError:
        sock.close()
        raise
    return sock


def sock_port(fd: int) -> int:
    with socket.socket(fileno=os.dup(fd)) as s:
        return s.getsockname()[1]


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
    """The public keys: the salt, where the front listens, a tokenless job's join (keys.py)."""
    return dist.PrefixStore(keys.DDPTOP_PREFIX + attempt_prefix, store)


def job_view(store: dist.Store, attempt_prefix: str, namespace: str) -> dist.Store:
    """The job's namespace in the store: the process group's keys when every rank knows the token (keys.py);
    listable by anyone on torch >= 2.x, so nothing of ddptop's own lives here (hub.py)."""
    return dist.PrefixStore(f"{keys.DDPTOP_PREFIX}{attempt_prefix}/{namespace}", store)



def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]
