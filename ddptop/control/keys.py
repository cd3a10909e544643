"""Every store key ddptop uses, in one place, with the cap on what ddptop reads from each.

torch's TCPStore keeps only torch's rendezvous and the public join keys, under PrefixStore("ddptop<prefix>"): the
salt and where the front listens (its ports and public key: a joining rank or `ddptop ctl` needs them before it can
prove anything), and the join handshake's (a joining rank may not know the token yet; with a token, under
PrefixStore("ddptop<prefix>/<namespace>"), sealed). Everything after the join goes over the front's sockets
(transport.py, hub.py: ZeroMQ with CURVE), never through the store. The caps below refuse what is larger than
ddptop ever writes, before parsing.
"""

PG_PREFIX = "pg"  # the process group's own keys (under the namespace when every rank knows the token)
DDPTOP_PREFIX = "ddptop"

# -- public: the join handshake ----------------------------------------------------------------------------
SALT = "salt"  # the job's scrypt salt, hex (auth.stretch): written by whoever hosts the job's front
CHANNEL = "channel"  # the front's ports and public key (session.publish); a forged one only gets a refused handshake
MAX_PUBLIC_BYTES = 64
VERDICT = "join/verdict"  # rank 0's answer, sealed with the token when the job has one
MAX_HELLO_BYTES = 64 * 1024
MAX_VERDICT_BYTES = 16 * 1024


def join(rank: int) -> str:
    """A rank's hello: versions, host, pid, device, world size, a nonce; signed with the token."""
    return f"join/{rank}"


# -- what travels over the front's sockets -------------------------------------------------------------------
MAX_BATCH_BYTES = 4 * 1024 * 1024  # a telemetry batch: the publisher splits larger ones (transport.MAX_TEL_BYTES)
MAX_SMALL_BYTES = 4096  # heartbeats, requests, answers
MAX_STATUS_BYTES = 16 * 1024
MAX_COUNTER = 1 << 53  # a counter beyond this is not ours
MAX_RECENT = 10  # recent steps per rank the front keeps for `ctl status` (hub.RECENT)

# -- seal contexts: what a sealed value says it is (auth.seal binds the context into the MAC), for the two paths no
# library protects: the join handshake in torch's store, and rank 0's decisions over the process group
CTX_VERDICT = "verdict"  # the join handshake's answer under VERDICT (sealed with the token when the job has one)


def ctx_hello(rank: int) -> str:
    return f"hello {rank}"


def ctx_decision(job_id: str, request_id: int) -> str:
    return f"decision {job_id} {request_id}"
