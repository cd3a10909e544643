"""Every store key ddptop uses, in one place, with the cap on what ddptop reads from each.

torch's TCPStore keeps only torch's rendezvous (with a token, under PrefixStore("ddptop<prefix>/<namespace>")) and
the public keys, under PrefixStore("ddptop<prefix>"): the salt and where the front listens (its ports and public
key: a joining rank or `ddptop ctl` needs them before it can prove anything), and, in a job without a token only,
the join's hellos and verdict in clear (nothing can be checked there: README's trust model). With a token the join
and everything after it go over the front's sockets (transport.py, hub.py: ZeroMQ with CURVE), never through the
store. The caps below refuse what is larger than ddptop ever writes, before parsing.
"""

PG_PREFIX = "pg"  # the process group's own keys (under the namespace when every rank knows the token)
DDPTOP_PREFIX = "ddptop"

# -- public: where the front is; the join of a job without a token (train/join.py) --------------------------
SALT = "salt"  # the job's scrypt salt, hex (auth.stretch): written by whoever hosts the job's front
CHANNEL = "channel"  # the front's ports and public key (session.publish); a forged one only gets a refused CURVE key
MAX_PUBLIC_BYTES = 64
VERDICT = "join/verdict"  # rank 0's answer (a job with a token: over the front's sockets, hub.py)
MAX_HELLO_BYTES = 64 * 1024  # a hello, in the store or at the front
MAX_VERDICT_BYTES = 16 * 1024  # and ~32 bytes per rank (each one's nonce)


def join(rank: int) -> str:
    """A rank's hello: versions, host, pid, device, world size, a nonce (a job with a token: at the front)."""
    return f"join/{rank}"


# -- what travels over the front's sockets -------------------------------------------------------------------
MAX_BATCH_BYTES = 4 * 1024 * 1024  # a telemetry batch: the publisher splits larger ones (transport.MAX_TEL_BYTES)
MAX_SMALL_BYTES = 4096  # heartbeats, requests, answers
MAX_STATUS_BYTES = 16 * 1024
MAX_COUNTER = 1 << 53  # a counter beyond this is not ours
MAX_RECENT = 10  # recent steps per rank the front keeps for `ctl status` (hub.RECENT)
