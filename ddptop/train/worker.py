"""One rank's process: join the job, train, publish events, leave cleanly."""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import socket
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Callable

import torch
import torch.distributed as dist
import zmq

import ddptop
from ddptop import metrics
from ddptop.config import RunConfig
from ddptop.control import keys, session, transport
from ddptop.control.agent import ControlAgent, Link
from ddptop.control.auth import JobKeys, namespace, new_job_id, stretch
from ddptop.control import store as stores
from ddptop.control.bus import Publisher
from ddptop.errors import DataError, DdptopError, PeerLost, RendezvousError, UsageError, say_line, user_code_line
from ddptop.events import RankJoined
from ddptop.probes.clock import clock_for
from ddptop.probes.step import StepProbe
from ddptop.sources.gpu import cuda_uuid
from ddptop.sources.sampler import SystemSampler
from ddptop.sources.system import job_interface
from ddptop.train import devices, lifetime, specs
from ddptop.train.join import PARAMS_SHOWN, FrontBoard, StoreBoard, join as join_job
from ddptop.train.loop import Trainer
from ddptop.rendezvous import Rendezvous
from ddptop import testhooks
from ddptop.testhooks import model_tweaks, rank_hooks


@dataclass(frozen=True)
class WorkerOptions:
    timeout_s: float = 60.0  # give up on an unreachable master / missing ranks after this long
    pg_timeout_s: float = 300.0  # a collective that waits longer than this means a peer is gone
    token: str = ""  # the job token: rank 0 checks control messages and (with check_token) joining ranks
    check_token: bool = False  # every rank must know the token: it was typed, or the front started all ranks
    job_id: str = ""  # rank 0's job id (auth.new_job_id), set by whoever collects the job's telemetry
    salt: bytes = b""  # the job's scrypt salt (auth.stretch), set by whoever hosts the front; else read from the store
    lost_after_s: float = 10.0  # the front marks a rank lost after this long without a valid heartbeat
    test_env: tuple[tuple[str, str], ...] = ()  # the front's test hooks (testhooks.carried), set in a local rank


def pick_device(cfg: RunConfig, rdv: Rendezvous) -> tuple[torch.device, str]:
    """This rank's device and backend by the policy in train/devices.py (one rank per GPU under nccl)."""
    gpus = devices.visible_gpus()
    placement = devices.place(cfg.backend, cfg.device, rdv.local_world_size, gpus)
    for sync in cfg.sweep or (cfg.sync,):
        devices.check_strategy(placement.device, placement.backend, sync.strategy)
    index = placement.gpu_index(rdv.local_rank, gpus)
    if index is None:
        return torch.device("cpu"), placement.backend
    if index >= gpus:
        raise UsageError(f"local rank {rdv.local_rank} has no GPU of its own ({gpus} visible): nccl needs one per rank")
    torch.cuda.set_device(index)
    return torch.device("cuda", index), placement.backend


def hello(cfg: RunConfig, rdv: Rendezvous, device: torch.device, backend: str, threads: int,
          model: torch.nn.Module | None = None) -> dict:
    params = [[name, list(p.shape)] for name, p in model.named_parameters()] if model is not None else []
    # the digest covers every parameter; the first PARAMS_SHOWN name the first difference within the hello's 64 KB
    digest = hashlib.sha256(json.dumps(params).encode()).hexdigest()
    return {"params_sha256": digest, "params": params[:PARAMS_SHOWN],
        "rank": rdv.rank, "world_size": rdv.world_size, "host": socket.gethostname(), "pid": os.getpid(),
        "device": str(device), "backend": backend, "threads": threads, "torch_version": torch.__version__,
        "ddptop_version": ddptop.__version__, "protocol": ddptop.PROTOCOL_VERSION, "rank_source": rdv.source,
        "run_config": cfg.to_dict(),
    }


def run_rank(cfg: RunConfig, rdv: Rendezvous, options: WorkerOptions) -> int:
    """Train as one rank. Raises DdptopError for anything the user can act on."""
    with joined(cfg, rdv, options) as rank:
        trainer = Trainer(cfg, rdv.rank, rdv.world_size, rank.device, rank.emit,
                          make_probe(cfg, rdv.rank, rdv.world_size, rank.device, rank.emit), local_ranks=rdv.local_world_size,
                          parts=rank.parts)
        rank.agent = ControlAgent(rdv.rank, rdv.world_size, rank.job, rank.connect, rank.emit, trainer.check,
                                  cfg.first_sync, group=rank.group, sweep_segments=len(cfg.sweep))
        return trainer.run(rank.agent)


@dataclass
class Joined:
    """What a rank that joined its job trains with (ddptop's loop, or the user's own through ddptop/api.py)."""

    device: torch.device
    group: Any  # the control group (None for one rank)
    job: JobKeys
    connect: Callable[[], Any]  # the control agent thread's sockets to the front (agent.Link)
    emit: Callable[[Any], None]
    agent: ControlAgent | None = None  # set by the trainer once it exists: closed on the way out
    parts: Any = None  # ddptop's own loop: the model, data and loss built from the spec (train/specs.py)


@contextmanager
def joined(cfg: RunConfig, rdv: Rendezvous, options: WorkerOptions, model: torch.nn.Module | None = None):
    """Join the job (the join, process groups, the front's sockets, system samples) for the block; on the way out
    a peer's failure becomes PeerLost (one line), and the agent, sampler, publisher and process groups close.
    `model`: the user's own (ddptop/api.py); None builds ddptop's from cfg's spec (Joined.parts)."""
    threads, why = devices.agreed_threads(devices.thread_count(cfg.threads, rdv.local_world_size),
                                          devices.openmp_default())
    if why and rdv.local_rank == 0:  # a script that imported torch before ddptop could set OMP_NUM_THREADS
        print(f"ddptop: rank {rdv.rank} {why}", file=sys.stderr)
    torch.set_num_threads(threads)
    device, backend = pick_device(cfg, rdv)
    iface = job_interface(rdv.master, cfg.iface)
    bound = devices.bind_interfaces(iface, typed=cfg.iface is not None)  # before any group: the control group too
    stores.resolve(rdv.master, rdv.port)
    base = stores.connect(rdv.master, rdv.port, options.timeout_s, rdv.source)
    prefix = rdv.key_prefix
    public = stores.ddptop_view(base, prefix)
    # with a token every rank knows, the join goes over the front's sockets with the join role's CURVE key (a wrong
    # token never gets a byte read) and the process group's keys live apart from the public ones
    secure = options.check_token
    control = _control_key(rdv.rank, options, public)
    view = stores.job_view(base, prefix, namespace(control)) if secure else public
    # the model before the join: rank 0 compares every rank's parameter names and shapes (one spec, one model)
    parts = specs.build(cfg, model_tweaks(rdv.rank)) if model is None else None
    me = hello(cfg, rdv, device, backend, threads, parts.model if parts is not None else model)
    ports = session.read_endpoints(public, options.timeout_s)
    board = FrontBoard(rdv.master, ports["ctl"], JobKeys.from_control(control, "")) if secure \
        else StoreBoard(public, rdv.world_size)
    join_job(board, rdv.rank, rdv.world_size, me, options.timeout_s, secure)
    group, job = connect_ranks(rdv, backend, view, options, control)

    def connect():
        return Link(rdv.master, ports, job, rdv.rank)

    publisher = Publisher(transport.client_socket(zmq.PUSH, job, "rank", transport.endpoint(rdv.master, ports["tel"]),
                                                  SNDHWM=transport.SEND_HWM), rdv.rank)
    publisher.emit(RankJoined(rank=rdv.rank, world_size=rdv.world_size, host=me["host"], pid=me["pid"],
                              device=me["device"], backend=backend, threads=threads,
                              torch_version=torch.__version__, ddptop_version=ddptop.__version__,
                              rank_source=rdv.source, t=time.time(), gloo_ifname=bound["GLOO_SOCKET_IFNAME"],
                              nccl_ifname=bound["NCCL_SOCKET_IFNAME"]))
    sampler = None
    if cfg.probes != "off":
        gpus = [device.index] if device.type == "cuda" else []
        sampler = SystemSampler(rdv.rank, me["host"], iface, publisher.emit, gpu_indices=gpus,
                                gpu_uuids=[cuda_uuid(i) for i in gpus])
        sampler.start()
    rank = Joined(device, group, job, connect, publisher.emit, parts=parts)
    try:
        yield rank
    except RuntimeError as exc:
        reason = _peer_failure(exc)
        if reason == "timed out":  # gloo's own wait, bounded by the process groups' timeout
            reason = f"a collective waited longer than {options.pg_timeout_s:g} s, --collective-timeout"
        if reason:
            raise PeerLost(f"lost contact with another rank ({reason}); stopping") from None
        raise
    finally:
        if rank.agent is not None:
            rank.agent.close()
        if sampler is not None:
            sampler.stop()
        publisher.close()
        _leave()


def _control_key(rank: int, options: WorkerOptions, public) -> bytes:
    """The job's control key, where this rank knows the token (rank 0 always does); b"" elsewhere. Rank 0 of a job
    without a front publishes the salt it was given; the others read it."""
    if not (options.check_token or rank == 0):
        return b""
    if options.salt and rank == 0:
        session.publish(public, salt=options.salt)
    return stretch(options.token, options.salt or session.read_salt(public, options.timeout_s))


def connect_ranks(rdv: Rendezvous, backend: str, view, options: WorkerOptions, control: bytes):
    """The process groups and the job keys. The process group's keys in the store are torch's and cannot be
    protected (README: trust model): a start someone disturbed by overwriting them is one line and exit 4, never
    torch's MemoryError or a C++ message."""
    pg_store = dist.PrefixStore(keys.PG_PREFIX, view)
    time.sleep(rank_hooks(rdv.rank).pg_s)  # test-only (testhooks: pg=RANK:MS): 0 otherwise
    try:
        dist.init_process_group(backend, store=pg_store, rank=rdv.rank, world_size=rdv.world_size,
                                timeout=timedelta(seconds=options.pg_timeout_s))
        # control traffic, even under nccl; new_group's own default timeout is torch's 30 min, not the job's
        group = dist.new_group(backend="gloo", timeout=timedelta(seconds=options.pg_timeout_s)) \
            if rdv.world_size > 1 else None
        return group, share_job_keys(rdv.rank, options, group, control)
    except DdptopError:
        raise
    except RuntimeError as exc:  # gloo/nccl could not connect the ranks to each other, or read garbage
        if _peer_failure(exc) or not _disturbed(exc):
            detail = _peer_failure(exc) or _first_line(exc)
            raise RendezvousError(f"the ranks found each other but could not connect ({backend}: {detail}); "
                                  f"check that every node can reach the others (--iface picks the interface)") from None
        raise _disturbed_start(rdv, exc) from None
    except Exception as exc:  # MemoryError (std::bad_alloc), ValueError: what torch makes of garbage in its keys
        raise _disturbed_start(rdv, exc) from None


def _disturbed(exc: Exception) -> bool:
    """A gloo/c10d error that comes from what the store held (an address or size that is not a peer's)."""
    text = str(exc).lower()
    return any(s in text for s in ("bad_alloc", "enforce fail", "unpack", "deserializ", "_m_create"))


def _disturbed_start(rdv: Rendezvous, exc: Exception) -> RendezvousError:
    """torch's own words here are a C++ allocator's or parser's (std::bad_alloc): DDPTOP_DEBUG=1 shows them."""
    detail = f" ({type(exc).__name__}: {_first_line(exc)[:100]})" if os.environ.get("DDPTOP_DEBUG") else ""
    return RendezvousError(f"the process group's start was disturbed: torch's keys in the store held what torch did "
                           f"not write; someone else on port {rdv.port} may have overwritten them "
                           f"(docs/explanation/trust-model.md){detail}")


def share_job_keys(rank: int, options: WorkerOptions, group, control: bytes = b"") -> JobKeys:
    """The job's keys on every rank. Rank 0 broadcasts the job id over the process group; ranks that know the token
    derive every key from it themselves, so no key crosses the network. Only when some rank was started without the
    token (torchrun, Slurm) does the block carry the ranks key and the front's public key as well, in clear over
    gloo as before issue 41: with them such a rank can PUSH telemetry and heartbeats, nothing else (transport.py)."""
    mine = JobKeys.from_control(control, options.job_id or new_job_id()) if rank == 0 else None
    if group is None:
        return mine
    packed = torch.zeros(JobKeys.PACKED, dtype=torch.uint8)
    if rank == 0:
        blob = mine.pack(transport.server_public(mine), secret=not options.check_token)
        packed = torch.tensor(list(blob), dtype=torch.uint8)
    dist.broadcast(packed, src=0, group=group)
    if rank == 0:
        return mine
    got = JobKeys.unpack(bytes(packed.tolist()))
    return JobKeys.from_control(control, got.job_id) if options.check_token else got


def make_probe(cfg: RunConfig, rank: int, world_size: int, device: torch.device, emit):
    """`--probes all`: phases, collectives and per-layer spans; `system`/`off`: step time, ddptop's cost, loss."""
    return StepProbe(rank, clock_for(device.type), emit, metrics.span_cadence(cfg.span_every, world_size),
                     spans=True, detail=cfg.probes == "all")


PEER_FAILURES = ("connection closed by peer", "connection reset by peer", "timed out", "broken pipe",
                 "connection refused")


def _peer_failure(exc: Exception) -> str:
    """The short reason when a collective failed because a peer went away, else ''."""
    text = str(exc).lower()
    return next((s for s in PEER_FAILURES if s in text), "")


def _first_line(exc: Exception) -> str:
    """The message's first line without a C++ source location (`[../gloo/pair.cc:42] `): for the user, not a bug."""
    lines = str(exc).strip().splitlines() or [type(exc).__name__]
    return re.sub(r"^\[[^\]]*\.(?:cc|cpp|h|hpp):\d+\]\s*", "", lines[0])[:200]


def _leave() -> None:
    if dist.is_initialized():
        try:
            dist.destroy_process_group()
        except Exception:
            pass


def rank_entry(cfg: RunConfig, rdv: Rendezvous, options: WorkerOptions) -> None:
    """multiprocessing target for a local rank: one line on failure, an exit code, never a traceback."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole process group: the front decides
    lifetime.settle()
    lifetime.die_with_parent()
    lifetime.name(f"ddptop-rank-{rdv.rank}")
    try:
        testhooks.adopt(options.test_env)  # test-only: what the front was started with, not the fork server's
        time.sleep(rank_hooks(rdv.rank).join_s)  # test-only (testhooks: join=RANK:MS): 0 otherwise
        run_rank(cfg, rdv, options)
    except DdptopError as exc:
        say_line(f"ddptop rank {rdv.rank}: {exc}")
        sys.exit(exc.exit_code)
    except Exception as exc:  # the user's code, or a bug: still one line; DDPTOP_DEBUG=1 shows the traceback
        if os.environ.get("DDPTOP_DEBUG"):
            raise
        mine = user_code_line(exc)
        if mine:
            say_line(f"ddptop rank {rdv.rank}: {mine} (DDPTOP_DEBUG=1 shows where)")
            sys.exit(DataError.exit_code)
        say_line(f"ddptop rank {rdv.rank}: internal error: {type(exc).__name__}: {_first_line(exc)}")
        sys.exit(70)
