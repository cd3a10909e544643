"""Who and where each rank is: from flags, torchrun's or Slurm's environment, or local launch."""

from __future__ import annotations

import os
import re
import socket
from dataclasses import dataclass
from typing import Mapping

from ddptop.errors import RendezvousError, UsageError

DEFAULT_PORT = 29511  # not torchrun's 29500, so ddptop's store never collides with a torchrun agent's
MAX_WORLD_SIZE = 65536
MAX_LOCAL = 256


@dataclass(frozen=True)
class Rendezvous:
    master: str
    port: int
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    source: str  # "local", "flags", "torchrun", "slurm": shown in headers and recordings
    agent_store: bool = False  # torchrun's agent already hosts a store at master:port; join it as a client
    attempt: int = 0  # torchrun restart count: keys are namespaced per attempt

    @property
    def key_prefix(self) -> str:
        """Under torchrun's agent store, ddptop's keys live in a namespace of their own per restart attempt."""
        return f"/attempt_{self.attempt}" if self.agent_store else ""


def check_host(host: str, port: int) -> None:
    """A master name that does not resolve is one line at once, not a C++ trace after a connect timeout."""
    try:
        socket.getaddrinfo(host, port or None, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError, ValueError) as exc:
        reason = exc.strerror if isinstance(exc, socket.gaierror) else "not a valid host name"
        raise RendezvousError(f"cannot find the master {host!r}: {reason}") from None


def first_slurm_host(nodelist: str) -> str:
    """First host of a Slurm node list: "node[03-05,7],gpu1" → "node03"."""
    match = re.match(r"([^,\[]+)(\[([^\]]+)\])?", nodelist.strip())
    if not match:
        raise UsageError(f"cannot read SLURM_NODELIST {nodelist!r}")
    prefix, _, ranges = match.groups()
    if not ranges:
        return prefix
    return prefix + ranges.split(",")[0].split("-")[0]


def _int(env: Mapping[str, str], name: str) -> int:
    try:
        return int(env[name])
    except ValueError:
        raise UsageError(f"{name}={env[name]!r} is not a whole number") from None


def from_torchrun(env: Mapping[str, str]) -> Rendezvous | None:
    if not all(k in env for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")):
        return None
    return Rendezvous(
        master=env["MASTER_ADDR"], port=_int(env, "MASTER_PORT"), rank=_int(env, "RANK"),
        world_size=_int(env, "WORLD_SIZE"), local_rank=_int(env, "LOCAL_RANK"),
        local_world_size=_int(env, "LOCAL_WORLD_SIZE") if "LOCAL_WORLD_SIZE" in env else 1,
        source="torchrun", agent_store=env.get("TORCHELASTIC_USE_AGENT_STORE") == "True",
        attempt=_int(env, "TORCHELASTIC_RESTART_COUNT") if "TORCHELASTIC_RESTART_COUNT" in env else 0,
    )


def from_slurm(env: Mapping[str, str], port: int | None) -> Rendezvous | None:
    if not all(k in env for k in ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_NODELIST")):
        return None
    if port is None:
        job = env.get("SLURM_JOB_ID", "")
        # Lightning's convention: a port derived from the job id keeps two jobs on one node apart
        port = _int(env, "MASTER_PORT") if "MASTER_PORT" in env else (15000 + int(job[-4:]) if job.isdigit() else 12910)
    tasks_per_node = re.match(r"\d+", env.get("SLURM_NTASKS_PER_NODE", "1"))
    return Rendezvous(
        master=env.get("MASTER_ADDR") or first_slurm_host(env["SLURM_NODELIST"]), port=port,
        rank=_int(env, "SLURM_PROCID"), world_size=_int(env, "SLURM_NTASKS"),
        local_rank=_int(env, "SLURM_LOCALID") if "SLURM_LOCALID" in env else 0,
        local_world_size=int(tasks_per_node.group()) if tasks_per_node else 1, source="slurm",
    )


def resolve(master: str | None, port: int | None, rank: int | None, world_size: int | None, local: int | None,
            env: Mapping[str, str] | None = None, default_local: int = 2) -> Rendezvous:
    """Flags first, then torchrun's environment, then Slurm's; with none of them, `default_local` local ranks
    (one per GPU on a CUDA machine, else 2: see train/devices.py)."""
    env = os.environ if env is None else env
    found = _resolve(master, port, rank, world_size, local, env, default_local)
    if found.port and not 1 <= found.port <= 65535:  # MASTER_PORT=70000 would wrap around to 4464
        raise UsageError(f"the port must be between 1 and 65535, got {found.port} (from {found.source})")
    if not 1 <= found.world_size <= MAX_WORLD_SIZE or not 0 <= found.rank < found.world_size:
        raise UsageError(f"rank {found.rank} of world size {found.world_size} (from {found.source}): the world size "
                         f"must be 1..{MAX_WORLD_SIZE} and the rank 0..world size - 1")
    if found.source == "local" and found.world_size > MAX_LOCAL:
        raise UsageError(f"--local starts one process per rank: at most {MAX_LOCAL}, got {found.world_size}")
    return found


def _resolve(master: str | None, port: int | None, rank: int | None, world_size: int | None, local: int | None,
             env: Mapping[str, str], default_local: int = 2) -> Rendezvous:
    if local is not None:
        if local < 1:
            raise UsageError(f"--local must be at least 1, got {local}")
        if rank is not None or master is not None:
            raise UsageError("--local starts every rank on this machine: drop --rank/--master")
        return Rendezvous("127.0.0.1", port or 0, 0, local, 0, local, "local")
    if rank is not None or master is not None:
        if rank is None or world_size is None:
            raise UsageError("with --master, give --rank R and --world-size N too")
        if world_size < 1 or not 0 <= rank < world_size:
            raise UsageError(f"--rank must be in 0..{world_size - 1} for --world-size {world_size}, got {rank}")
        return Rendezvous(master or "127.0.0.1", port or DEFAULT_PORT, rank, world_size, 0, 1, "flags")
    found = from_torchrun(env) or from_slurm(env, port)
    if found is not None:
        return found
    count = world_size or default_local
    return Rendezvous("127.0.0.1", port or 0, 0, count, 0, count, "local")
