"""Provides the server that local CPU ranks fork from, forked out of the `ddptop` command itself once it has imported
torch, rather than started as a fresh interpreter that imports torch again (~2 CPU-s of a tiny job's ~7; a spawned
single rank cost ~5 more).

multiprocessing's forkserver does the rest as before (front/supervisor.py `_context`): this only starts its server,
at a moment the command has no thread of its own, and tells multiprocessing where it listens. A server that could not
start, or died, is started the usual way by `forkserver.ensure_running`.

OpenMP reads OMP_NUM_THREADS once, when torch loads it, and threads that gloo starts later (PowerSGD's math runs in
them) take that count: so the run command sets it before its first `import torch` (cli/run.py `_checked`), and forks
its ranks from itself only when it loaded torch after that (not when a caller in its process had: a test)."""

from __future__ import annotations

import gc
import glob
import os
import signal
import socket
import threading

# What the server imports once for all the ranks (the command has imported torch and the worker already): the
# first makes it die with the front, torch._dynamo is what the optimizer pulls in (1.4-2.7 CPU-s here).
PRELOAD = ("ddptop.train.server", "ddptop.train.worker", "torch._dynamo")
NAME = "ddptop-forks"  # the server's name as ps and psutil show it (its command line is the front's)


def fronted(rdv) -> bool:
    """Whether this command is a front that starts its machine's ranks itself (front/run.py): --local's, or rank 0
    beside a --rank 0 front; else the command is the rank (torchrun, Slurm, --rank R > 0)."""
    return rdv.source == "local" or (rdv.source == "flags" and rdv.rank == 0)


def plan(cfg, rdv) -> int:
    """The thread count of each local rank if this command will fork them from a server of its own (a front's ranks,
    one or several, on the CPU, no GPU here: what `_context` picks the forkserver for), else 0. Decided before torch
    loads, from what needs no torch. A CUDA device file (/dev/nvidia0) keeps the usual start even for `--device cpu`:
    the command asks torch about CUDA before the fork, and a process that touched CUDA is never forked."""
    if not fronted(rdv) or cfg.device == "cuda" or cfg.backend == "nccl":
        return 0
    if glob.glob("/dev/nvidia[0-9]*"):
        return 0
    from ddptop.train.devices import thread_count

    return thread_count(cfg.threads, rdv.local_world_size)


def start() -> bool:
    """Fork the server now, if this process runs no other thread (a fork copies only the calling one: a lock another
    thread held would stay held in the copy). Whether it started."""
    from multiprocessing import connection, forkserver, resource_tracker

    server = forkserver._forkserver
    if threading.active_count() > 1 or getattr(server, "_forkserver_pid", None) is not None:
        return False
    resource_tracker.ensure_running()  # as ensure_running does first: the ranks report to the front's tracker
    address = connection.arbitrary_address("AF_UNIX")
    listener = socket.socket(socket.AF_UNIX)
    alive_r, alive_w = os.pipe()  # the server ends when the front's end closes (every rank holds a copy of it too)
    try:
        listener.bind(address)
        os.chmod(address, 0o600)
        listener.listen()
        pid = os.fork()
    except OSError:
        listener.close()
        os.close(alive_r)
        os.close(alive_w)
        return False
    if pid == 0:
        _serve(listener, alive_r, alive_w)
    listener.close()
    os.close(alive_r)
    server._forkserver_address, server._forkserver_alive_fd, server._forkserver_pid = address, alive_w, pid
    return True


def _serve(listener: socket.socket, alive_r: int, alive_w: int) -> None:
    """The forked server: SIGINT ignored at once (its ranks inherit that, as from a server started while the front
    ignored it), the collector off (its ranks turn it on), then multiprocessing's own server loop; it never returns."""
    code = 1
    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        gc.disable()  # while the preloads load (torch._dynamo: ~1 CPU-s); each rank freezes them (lifetime.settle)
        os.close(alive_w)
        from multiprocessing import forkserver

        from ddptop.train import lifetime

        lifetime.name(NAME)
        lifetime.die_with_parent()  # train.server would, but this process may have imported it already
        forkserver.main(listener.fileno(), alive_r, list(PRELOAD))
    except SystemExit as exc:  # the front closed its end of the alive pipe: the server's normal end
        code = exc.code if isinstance(exc.code, int) else 0
    except BaseException:
        code = 1
    finally:
        os._exit(code)
