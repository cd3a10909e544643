"""Starting a run in the right shape for where the ranks were found: a front process, or this process as a rank."""

from __future__ import annotations

import sys
from dataclasses import replace

from ddptop.config import RunConfig
from ddptop.control.token import remove_job_file, resolve_token, write_job_file
from ddptop.headless import HeadlessPrinter, consume
from ddptop.train.rendezvous import Rendezvous
from ddptop.train.worker import WorkerOptions


def expected_total_steps(cfg: RunConfig, world_size: int) -> int:
    if cfg.sweep:
        return len(cfg.sweep) * cfg.sweep_steps()
    if cfg.steps:
        return cfg.steps
    if cfg.dataset == "synthetic":
        per_rank = cfg.synthetic_size // world_size
        return max(1, per_rank // cfg.sync.batch_size) * cfg.epochs
    return 0  # unknown until rank 0 reports steps_per_epoch


def run(cfg: RunConfig, rdv: Rendezvous, timeout_s: float, log_every: int, token: str | None = None) -> int:
    token_value, _ = resolve_token(token)
    options = WorkerOptions(timeout_s=timeout_s, token=token_value)
    printer = HeadlessPrinter(expected_total_steps(cfg, rdv.world_size), every=log_every)
    if rdv.source == "local" or (rdv.source == "flags" and rdv.rank == 0):
        from ddptop.train.launch import run_front

        print(f"ddptop: {rdv.world_size} ranks, master {rdv.master} (ranks found by {rdv.source})", file=sys.stderr)
        return run_front(cfg, rdv, options, lambda source, job: consume(printer, source, job))
    return run_direct(cfg, rdv, options, printer)


def run_direct(cfg: RunConfig, rdv: Rendezvous, options: WorkerOptions, printer: HeadlessPrinter) -> int:
    """This process is one rank (a worker machine, torchrun, Slurm). Rank 0 also prints the job's progress."""
    from ddptop.train.worker import run_rank

    print(f"ddptop: rank {rdv.rank} of {rdv.world_size}, master {rdv.master}:{rdv.port} "
          f"(ranks found by {rdv.source})", file=sys.stderr)
    host_store = rdv.rank == 0 and rdv.source != "flags"
    echo = (lambda event: printer.handle([event])) if rdv.rank == 0 else None
    if rdv.rank == 0:  # `ddptop ctl` on this machine finds the job and its token here
        write_job_file(rdv.master, rdv.port, options.token, rdv.world_size)
    try:
        steps = run_rank(cfg, rdv, replace(options, host_store=host_store), echo)
    finally:
        if rdv.rank == 0:
            remove_job_file(rdv.port)
    print(f"ddptop: rank {rdv.rank} finished {steps} steps", file=sys.stderr)
    return 0

