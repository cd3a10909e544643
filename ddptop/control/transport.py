"""Provides the job's sockets: ZeroMQ (pyzmq) with CURVE, one keypair per role, and who may open which socket.

ZeroMQ's CURVE (libsodium) authenticates and encrypts every connection and refuses a replayed, altered or spliced
message; its multipart messages are the only framing; its high-water marks bound every queue. Nothing here frames,
MACs or shakes hands: it picks keys, socket options and the ZAP policy (pyzmq's ThreadAuthenticator).

Keys, all from the job's control key (scrypt(token, per-job salt), auth.stretch), never sent anywhere:
- the server (the front's hub): `derive(control, "curve server")`;
- `ctl`, `attach`, rank 0's `agent`, and `join` (a rank that knows the token, proving it to the job at start-up:
  hub.py keeps its hello for rank 0): `derive(control, "curve <role>")`;
- every `rank`: the job's ranks key (auth.JobKeys.ranks), which ranks that know the token derive themselves and
  ranks started without it (torchrun, Slurm) receive from rank 0 over the process group, with the server's public
  key (worker.share_job_keys): such a rank can only PUSH telemetry, never send or answer a request.
The server lets through only those public keys, each on its own sockets (DOMAINS), and names the role in every
message (ZAP User-Id), so the hub checks each request against its role's rights (hub.RIGHTS).
"""

from __future__ import annotations

import os
import resource
import socket
import threading

import zmq
from zmq.utils import z85

from ddptop.control.auth import JobKeys, derive
from ddptop.errors import RendezvousError

ROLES = ("rank", "agent", "ctl", "attach", "join")
# which roles each server socket admits: telemetry in (PULL), requests (ROUTER), the republished stream (XPUB: it
# also says when someone listens, so the front republishes nothing while nobody does)
DOMAINS = {"tel": ("rank",), "ctl": ("agent", "ctl", "attach", "join"), "pub": ("ctl", "attach")}
MAX_TEL_BYTES = 9 << 20  # one telemetry batch (keys.MAX_BATCH_BYTES, 4 MiB) with room; a larger message is dropped
MAX_CTL_BYTES = 1 << 20  # a request, an agent's sync (status, answers): a few KiB
MAX_REPLY_BYTES = 256 << 20  # what a client accepts: `ctl status` of 65,536 ranks' recent steps
SEND_HWM = 1000  # batches a rank's socket holds while the front does not read (4 a second: 4 minutes)
RECV_HWM = 1000


def secret(job: JobKeys, role: str) -> bytes:
    """The role's 32-byte CURVE secret key (`rank`: the ranks key itself)."""
    if role == "rank":
        return job.ranks
    if not job.control:
        raise RendezvousError(f"this process has no job token: it cannot act as {role}")
    return derive(job.control, f"curve {role}")


def public(secret_key: bytes) -> bytes:
    """The 32-byte public key of a 32-byte secret (libsodium via libzmq)."""
    z85_public = zmq.curve_public(z85.encode(secret_key))
    return z85.decode(z85_public)


def server_public(job: JobKeys) -> bytes:
    return job.server or public(derive(job.control, "curve server"))


_context: tuple[int, zmq.Context] | None = None
_lock = threading.Lock()


def context() -> zmq.Context:
    """This process's context (a forked rank makes its own: a context never crosses a fork)."""
    global _context
    with _lock:
        if _context is None or _context[0] != os.getpid():
            _context = (os.getpid(), zmq.Context())
        return _context[1]


def client_socket(kind: int, job: JobKeys, role: str, endpoint: str, **options: int) -> zmq.Socket:
    """A socket of `kind` connected to `endpoint` as `role`, which accepts only the job's server key."""
    sock = context().socket(kind)
    mine = secret(job, role)
    sock.curve_secretkey = z85.encode(mine)
    sock.curve_publickey = z85.encode(public(mine))
    sock.curve_serverkey = z85.encode(server_public(job))
    sock.setsockopt(zmq.MAXMSGSIZE, MAX_REPLY_BYTES)
    sock.setsockopt(zmq.LINGER, 0)
    for name, value in options.items():
        sock.setsockopt(getattr(zmq, name), value)
    sock.connect(endpoint)
    return sock


def _authenticator(ctx: zmq.Context, keys: dict[bytes, str]):
    """ZAP: a socket's domain admits its roles' public keys only; the role becomes the message's User-Id. (pyzmq's
    ThreadAuthenticator, imported here: it pulls in asyncio, ~0.1 s that `ddptop ctl` does not need.)"""
    import zmq.auth.thread

    class Roles(zmq.auth.thread.ThreadAuthenticator):
        refused = 0

        def callback(self, domain: str, z85_key: bytes) -> bool:
            ok = keys.get(z85_key) in DOMAINS.get(domain, ())
            self.refused += not ok
            return ok

        def curve_user_id(self, client_public_key: bytes) -> str:
            return keys.get(z85.encode(client_public_key), "")

    return Roles(ctx)


class Server:
    """The front's three sockets, bound on the master's address: `tel` (PULL), `ctl` (ROUTER), `pub` (XPUB)."""

    def __init__(self, host: str, job: JobKeys):
        _more_files()
        self.ctx = zmq.Context()  # its own: the authenticator is one per context
        keys = {z85.encode(public(secret(job, role))): role for role in ROLES}
        self.auth = _authenticator(self.ctx, keys)
        self.auth.start()
        for domain in DOMAINS:
            self.auth.configure_curve_callback(domain, self.auth)
        mine = derive(job.control, "curve server")
        self.public = public(mine)
        address = _address(host)
        self.sockets: dict[str, zmq.Socket] = {}
        self.ports: dict[str, int] = {}
        kinds = {"tel": (zmq.PULL, MAX_TEL_BYTES), "ctl": (zmq.ROUTER, MAX_CTL_BYTES), "pub": (zmq.XPUB, 1024)}
        for name, (kind, cap) in kinds.items():
            sock = self.ctx.socket(kind)
            sock.curve_server = True
            sock.curve_secretkey = z85.encode(mine)
            sock.zap_domain = name.encode()
            sock.setsockopt(zmq.MAXMSGSIZE, cap)  # a larger message drops its connection, nothing else
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.RCVHWM, RECV_HWM)
            sock.setsockopt(zmq.SNDHWM, 10000 if kind == zmq.XPUB else RECV_HWM)
            self.ports[name] = _bind(sock, address)
            self.sockets[name] = sock
        self.host = host

    def endpoints(self) -> dict:
        """What the public store key says (keys.CHANNEL): the ports and the server's public key (z85)."""
        return {**self.ports, "key": z85.encode(self.public).decode()}

    def close(self) -> None:
        for sock in self.sockets.values():
            sock.close(linger=0)
        self.auth.stop()
        self.ctx.term()


def _more_files() -> None:
    """Each rank holds two connections to the front (telemetry, heartbeats): 1,024 ranks need more descriptors than
    the usual soft limit of 1,024, so the front raises it to the hard limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and (hard == resource.RLIM_INFINITY or soft < hard):
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def _address(host: str) -> str:
    """The master's address when it is one of this machine's (else every interface: NAT, a cluster alias)."""
    try:
        family, _, _, _, addr = socket.getaddrinfo(host, 0, type=socket.SOCK_STREAM)[0]
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.bind((addr[0], 0))
        return f"[{addr[0]}]" if family == socket.AF_INET6 else addr[0]
    except OSError:
        return "*"


def _bind(sock: zmq.Socket, address: str) -> int:
    if address.startswith("["):
        sock.setsockopt(zmq.IPV6, 1)
    try:
        return sock.bind_to_random_port(f"tcp://{address}")
    except zmq.ZMQError as exc:
        raise RendezvousError(f"cannot listen on {address} for the job's sockets: {exc}") from None


def endpoint(host: str, port: int) -> str:
    return f"tcp://[{host}]:{port}" if ":" in host else f"tcp://{host}:{port}"
