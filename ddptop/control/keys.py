"""Every store key ddptop uses, in one place. All live under the job's PrefixStore("ddptop/...")."""

PG_PREFIX = "pg"  # the process group's own keys
DDPTOP_PREFIX = "ddptop"

VERDICT = "join/verdict"  # rank 0's answer to the handshake: {"ok": true} or {"ok": false, "error": "..."}
FRONT = "front"  # the front process (TUI/printer) says it is listening
RECORDING = "front/recording"  # where the front records the job ({"path", "host"}; path "" when it does not)


def join(rank: int) -> str:
    """A rank's hello: versions, host, pid, device, world size."""
    return f"join/{rank}"


def tel_head(rank: int) -> str:
    """Sequence number of the newest telemetry batch a rank has published (starts at "0": none yet)."""
    return f"tel/{rank}/head"


def tel_batch(rank: int, seq: int) -> str:
    return f"tel/{rank}/{seq}"


CTL_SEQ = "ctl/seq"  # store.add counter: the id of the newest control request
STATUS = "ctl/status"  # rank 0's view, refreshed twice a second: step, config in force, segment, paused


def ctl_request(request_id: int) -> str:
    return f"ctl/req/{request_id}"


def ctl_response(request_id: int) -> str:
    """Rank 0's answer: refused, pending, applied at step k."""
    return f"ctl/resp/{request_id}"


def ctl_decision(request_id: int) -> str:
    """The checked configuration every rank applies for an accepted set request."""
    return f"ctl/decision/{request_id}"


def heartbeat(rank: int) -> str:
    return f"hb/{rank}"
