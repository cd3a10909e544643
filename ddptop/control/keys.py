"""Every store key ddptop uses, in one place. All live under the job's PrefixStore("ddptop/...")."""

PG_PREFIX = "pg"  # the process group's own keys
DDPTOP_PREFIX = "ddptop"

VERDICT = "join/verdict"  # rank 0's answer to the handshake: {"ok": true} or {"ok": false, "error": "..."}
FRONT = "front"  # the front process (TUI/printer) says it is listening


def join(rank: int) -> str:
    """A rank's hello: versions, host, pid, device, world size."""
    return f"join/{rank}"


def tel_head(rank: int) -> str:
    """Sequence number of the newest telemetry batch a rank has published (starts at "0": none yet)."""
    return f"tel/{rank}/head"


def tel_batch(rank: int, seq: int) -> str:
    return f"tel/{rank}/{seq}"
