"""Starting a run in the right shape for where the ranks were found: a front process, or this process as a rank."""

from __future__ import annotations

import sys
from dataclasses import replace

from ddptop.config import RunConfig
from ddptop.control.token import remove_job_file, resolve_token, write_job_file
from ddptop.headless import HeadlessConsumer, HeadlessPrinter
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


def open_recording(path: str | None, cfg: RunConfig, rdv: Rendezvous):
    """`--record FILE`: a RecordingWriter sink, created before any rank starts so a bad path fails first."""
    if not path:
        return None
    from ddptop.record.sqlite import RecordingWriter, base_meta

    where = {"source": rdv.source, "world_size": rdv.world_size, "master": rdv.master, "rank": rdv.rank}
    return RecordingWriter(path, base_meta(cfg.to_dict(), where))


def run(cfg: RunConfig, rdv: Rendezvous, timeout_s: float, log_every: int, token: str | None = None,
        record: str | None = None, headless: bool = True) -> int:
    recorder = open_recording(record, cfg, rdv)
    try:
        code = _run(cfg, rdv, timeout_s, log_every, token, recorder, headless, record)
    except BaseException:
        if recorder is not None:  # errors and Ctrl-C: what was received is still written; the first error wins
            recorder.close(quiet=True)
        raise
    if recorder is not None:
        recorder.close()
    return code


def _run(cfg: RunConfig, rdv: Rendezvous, timeout_s: float, log_every: int, token: str | None, recorder,
         headless: bool = True, record: str | None = None) -> int:
    token_value, given = resolve_token(token)
    options = WorkerOptions(timeout_s=timeout_s, token=token_value, check_token=given or rdv.source == "local")
    printer = HeadlessPrinter(expected_total_steps(cfg, rdv.world_size), every=log_every)
    if rdv.source == "local" or (rdv.source == "flags" and rdv.rank == 0):
        from ddptop.train.launch import run_front

        print(f"ddptop: {rdv.world_size} ranks, master {rdv.master} (ranks found by {rdv.source})", file=sys.stderr)
        sinks = [recorder] if recorder else []
        if headless or not _terminal():
            consumer = HeadlessConsumer(printer, sinks)
        else:
            from ddptop.tui.live import TuiConsumer

            consumer = TuiConsumer(sinks, record, expected_total_steps(cfg, rdv.world_size))
        code = run_front(cfg, rdv, options, consumer)
        if code != 0:
            lost = "; ".join(f"rank {e.rank} {e.reason}" for e in printer.lost.values())
            print(f"ddptop: the job failed{': ' + lost if lost else ''} (exit code {code})", file=sys.stderr)
        return code
    return run_direct(cfg, rdv, options, printer, recorder)


def _terminal() -> bool:
    """The live screen needs a terminal on both ends; without one (a pipe, CI) the run goes on headless."""
    if sys.stdin.isatty() and sys.stdout.isatty():
        return True
    print("ddptop: no terminal for the live screen; running headless (--headless says so quietly)", file=sys.stderr)
    return False


def run_direct(cfg: RunConfig, rdv: Rendezvous, options: WorkerOptions, printer: HeadlessPrinter,
               recorder=None) -> int:
    """This process is one rank (a worker machine, torchrun, Slurm). Rank 0 also prints the job's progress."""
    from ddptop.train.worker import run_rank

    print(f"ddptop: rank {rdv.rank} of {rdv.world_size}, master {rdv.master}:{rdv.port} "
          f"(ranks found by {rdv.source})", file=sys.stderr)
    host_store = rdv.rank == 0 and rdv.source != "flags"
    sinks = [printer] + ([recorder] if recorder else [])  # without a front, rank 0 records its own events
    echo = (lambda event: [sink.handle([event]) for sink in sinks]) if rdv.rank == 0 else None
    if rdv.rank == 0:  # `ddptop ctl` on this machine finds the job and its token here
        write_job_file(rdv.master, rdv.port, options.token, rdv.world_size)
    try:
        steps = run_rank(cfg, rdv, replace(options, host_store=host_store), echo)
    finally:
        if rdv.rank == 0:
            remove_job_file(rdv.port)
    print(f"ddptop: rank {rdv.rank} finished {steps} steps", file=sys.stderr)
    return 0

