"""Every store key ddptop uses, in one place, with the cap on what ddptop reads from each.

Public keys live under PrefixStore("ddptop<prefix>") in torch's TCPStore: the salt and the channel's port (a
joining rank or `ddptop ctl` needs them before it can prove anything), and the join handshake's (a joining rank
may not know the token yet; with a token, under PrefixStore("ddptop<prefix>/<namespace>"), sealed). Everything
after the join (the "job's namespace" below) lives on the job's channel (channel.py), which serves only a peer
that proves the job key, and every value in it is sealed (auth.seal) as well. The caps below refuse what is
larger than ddptop ever writes, before parsing.
"""

PG_PREFIX = "pg"  # the process group's own keys (under the namespace when every rank knows the token)
DDPTOP_PREFIX = "ddptop"

# -- public: the join handshake ----------------------------------------------------------------------------
SALT = "salt"  # the job's scrypt salt, hex (auth.stretch): written by whoever hosts the job's front
CHANNEL = "channel"  # the channel's port on the master (channel.py); a forged one only gets a refused handshake
MAX_PUBLIC_BYTES = 64
VERDICT = "join/verdict"  # rank 0's answer, sealed with the token when the job has one
MAX_HELLO_BYTES = 64 * 1024
MAX_VERDICT_BYTES = 16 * 1024


def join(rank: int) -> str:
    """A rank's hello: versions, host, pid, device, world size, a nonce; signed with the token."""
    return f"join/{rank}"


# -- the job's namespace -----------------------------------------------------------------------------------
MAX_BATCH_BYTES = 4 * 1024 * 1024  # a telemetry batch: the publisher splits larger ones (server cap: 8 MiB)
MAX_SMALL_BYTES = 4096  # heads, heartbeats, requests, responses
MAX_STATUS_BYTES = 16 * 1024
MAX_COUNTER = 1 << 53  # a counter beyond this is not ours


def tel_head(rank: int) -> str:
    """Sequence number of the newest telemetry batch a rank has published ("0": none yet), sealed."""
    return f"tel/{rank}/head"


def tel_batch(rank: int, seq: int) -> str:
    return f"tel/{rank}/{seq}"


CTL_SEQ = "ctl/seq"  # store.add counter: the id of the newest control request
STATUS = "ctl/status"  # rank 0's view, refreshed twice a second: step, config in force, segment, paused, job id
ENDED = "front/ended"  # the front's last word once the ranks are gone ({"lost", "why", "code"}), sealed
RECORDING = "front/recording"  # where the front records the job ({"path", "host"}; path "" when it does not), sealed


def ctl_request(request_id: int) -> str:
    """A signed request; rank 0 deletes it once read."""
    return f"ctl/req/{request_id}"


def ctl_response(request_id: int) -> str:
    """Rank 0's signed answer: refused, pending, applied at step k; the client deletes it once read."""
    return f"ctl/resp/{request_id}"


def heartbeat(rank: int) -> str:
    return f"hb/{rank}"


# -- seal contexts: what a sealed value says it is, so a value copied to another key, rank or job does not open ---
# (auth.seal binds the context into the MAC; both sides build it here, so a typo cannot refuse every value)
CTX_STATUS = "status"  # rank 0's view under STATUS
CTX_RECORDING = "recording"  # the front's word under RECORDING
CTX_ENDED = "ended"  # the front's last word under ENDED
CTX_VERDICT = "verdict"  # the join handshake's answer under VERDICT (sealed with the token when the job has one)


def ctx_hello(rank: int) -> str:
    return f"hello {rank}"


def ctx_tel(job_id: str, rank: int, seq: int) -> str:
    return f"tel {job_id} {rank} {seq}"


def ctx_head(job_id: str, rank: int) -> str:
    return f"head {job_id} {rank}"


def ctx_heartbeat(job_id: str, rank: int) -> str:
    return f"hb {job_id} {rank}"


def ctx_request(job_id: str, request_id: int) -> str:
    return f"req {job_id} {request_id}"


def ctx_response(job_id: str, request_id: int) -> str:
    return f"resp {job_id} {request_id}"


def ctx_decision(job_id: str, request_id: int) -> str:
    return f"decision {job_id} {request_id}"
