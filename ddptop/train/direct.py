"""Provides run_direct: this process is one rank (a worker machine, torchrun, Slurm); rank 0 also starts the collector.

Without a front process, rank 0 starts `python -m ddptop.front.collector` (by name: the rank side never imports the
front), which hosts the job's hub (control/hub.py), and hands it the job's coordinates on stdin, keeping stdin open while it trains; end of file means rank 0 is
done (finished, failed or killed).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from contextlib import contextmanager

from ddptop.errors import say_line
from ddptop.config import RunConfig
from ddptop.rendezvous import Rendezvous

GRACE_S = 10.0  # after rank 0 is done, the other ranks' last events get this long to arrive (the collector's wait)
START_S = 120.0  # the collector process may need a while to import torch on a busy node


def run_direct(cfg: RunConfig, rdv: Rendezvous, options, log_every: int, record: str | None,
               record_required: bool = False) -> int:
    """Train as one rank; rank 0 also hosts the store (unless torchrun's agent does) and the collector process."""
    from ddptop.train.worker import run_rank

    with hosting(cfg.to_dict(), rdv, options, log_every, record, record_required) as options:
        steps = run_rank(cfg, rdv, options)
    say_line(f"ddptop: rank {rdv.rank} finished {steps} steps")
    return 0


@contextmanager
def hosting(config: dict, rdv: Rendezvous, options, log_every: int, record: str | None,
            record_required: bool = False, own_store: bool = False):
    """For the block (this rank's training): rank 0 hosts the store (unless torchrun's agent does, or, with
    --master flags, ddptop's front) and the collector process, which records `config` as the run's; yields the
    options this rank trains with. `own_store`: rank 0 hosts the store with flags too (a user's own loop has no
    front process to host it)."""
    from dataclasses import replace

    from ddptop.control.auth import new_job_id, new_salt
    from ddptop.control.token import remove_job_file, write_job_file

    if rdv.rank != 0 or rdv.agent_store:  # an unreachable master is the one line this run prints
        wait_for_master(rdv.master, rdv.port, options.timeout_s, rdv.source)
    print(f"ddptop: rank {rdv.rank} of {rdv.world_size}, master {rdv.master}:{rdv.port} "
          f"(ranks found by {rdv.source})", file=sys.stderr)
    server = collector = None
    if rdv.rank == 0 and (rdv.source != "flags" or own_store) and not rdv.agent_store:
        from ddptop.control import store as stores

        server = stores.serve(rdv.port, rdv.master)  # kept until the collector has every rank's last events
    if rdv.rank == 0:
        options = replace(options, job_id=new_job_id(), salt=new_salt())  # the collector hosts the job's hub
        collector = CollectorProcess({"master": rdv.master, "port": rdv.port, "prefix": rdv.key_prefix,
                                      "world_size": rdv.world_size, "source": rdv.source, "rank": rdv.rank,
                                      "timeout_s": options.timeout_s, "token": options.token,
                                      "job_id": options.job_id, "salt": options.salt.hex(),
                                      "lost_after_s": options.lost_after_s,
                                      "log_every": log_every, "record": record, "record_required": record_required,
                                      "config": config})
        write_job_file(rdv.master, rdv.port, options.token, rdv.world_size, rdv.key_prefix)
    try:
        yield options
    finally:
        if collector is not None:
            collector.done()
            remove_job_file(rdv.master, rdv.port)
        del server


def wait_for_master(host: str, port: int, timeout_s: float, source: str) -> None:
    """Until the master's port accepts a connection (it may start after this rank), at most `timeout_s`."""
    import socket

    from ddptop.errors import RendezvousError

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            socket.create_connection((host, port), timeout=max(0.1, min(2.0, deadline - time.monotonic()))).close()
            return
        except OSError:
            if time.monotonic() >= deadline:
                raise RendezvousError(f"cannot reach the ddptop master at {host}:{port} (from {source}) after "
                                      f"{timeout_s:g} s: is rank 0 running and the port open?") from None
            time.sleep(0.2)


class CollectorProcess:
    """Rank 0's side: start the collector process, tell it when training is over, wait for it to finish."""

    def __init__(self, spec: dict):
        self.proc = subprocess.Popen([sys.executable, "-m", "ddptop.front.collector"], stdin=subprocess.PIPE,
                                     env=os.environ.copy())
        self.proc.stdin.write(json.dumps(spec).encode() + b"\n")  # on stdin: the token stays out of `ps`
        self.proc.stdin.flush()

    def done(self) -> None:
        try:
            self.proc.stdin.close()  # end of file: rank 0 is done
        except OSError:
            pass
        try:
            self.proc.wait(timeout=GRACE_S + START_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
