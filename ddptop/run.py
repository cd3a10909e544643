"""Starting a run in the right shape for where the ranks were found: a front process, or this process as a rank."""

from __future__ import annotations

import sys

from ddptop.config import RunConfig
from ddptop.control.token import resolve_token
from ddptop.front.feed import SharedState
from ddptop.front.recording import closing_lines
from ddptop.headless import HeadlessConsumer, HeadlessPrinter
from ddptop.train.rendezvous import Rendezvous
from ddptop.train.worker import WorkerOptions


def open_recording(path: str | None, cfg: RunConfig, rdv: Rendezvous):
    """`--record FILE` (or the default file): a RecordingWriter sink, created before any rank starts so a bad path
    fails first."""
    if not path:
        return None
    from ddptop.record.sqlite import RecordingWriter, base_meta

    return RecordingWriter(path, base_meta(cfg.to_dict(), where(rdv)))


def where(rdv: Rendezvous) -> dict:
    return {"source": rdv.source, "world_size": rdv.world_size, "master": rdv.master, "rank": rdv.rank}


def records_here(rdv: Rendezvous) -> bool:
    """Rank 0 records every rank (its front process, or under torchrun/Slurm its collector process)."""
    return rdv.rank == 0 or rdv.source == "local"


def run(cfg: RunConfig, rdv: Rendezvous, timeout_s: float, log_every: int, token: str | None = None,
        record: str | None = None, headless: bool = True) -> int:
    if record and not records_here(rdv):
        print(f"ddptop: rank {rdv.rank} leaves the recording to rank 0, which records every rank", file=sys.stderr)
        record = None
    token_value, given = resolve_token(token)
    options = WorkerOptions(timeout_s=timeout_s, token=token_value, check_token=given or rdv.source == "local")
    if not (rdv.source == "local" or (rdv.source == "flags" and rdv.rank == 0)):
        from ddptop.front.watch import run_direct

        return run_direct(cfg, rdv, options, log_every, record)
    state = SharedState()
    recorder = open_recording(record, cfg, rdv)
    try:
        code, printer = _run_front(cfg, rdv, options, log_every, state, recorder, headless, record)
    except BaseException:
        if recorder is not None:  # errors and Ctrl-C: what was received is still written; the first error wins
            recorder.close(quiet=True)
        raise
    if recorder is not None:
        recorder.close()
        snap = state.snapshot()
        for line in closing_lines(record, snap.step, len(snap.ranks)):
            print(line, flush=True)
    if code != 0:
        lost = "; ".join(f"rank {e.rank} {e.reason}" for e in printer.lost.values()) if printer else ""
        print(f"ddptop: the job failed{': ' + lost if lost else ''} (exit code {code})", file=sys.stderr)
    return code


def _run_front(cfg: RunConfig, rdv: Rendezvous, options: WorkerOptions, log_every: int, state: SharedState,
               recorder, headless: bool, record: str | None):
    """This machine hosts the store and starts its ranks; the feed records and shows them (screen or lines)."""
    from ddptop.train.launch import run_front

    sinks = [recorder] if recorder else []
    printer = None
    if headless or not _terminal():
        printer = HeadlessPrinter(every=log_every, state=state)  # the total comes with rank 0's RunStarted
        consumer = HeadlessConsumer(printer, sinks)
    else:
        from ddptop.tui.live import TuiConsumer

        consumer = TuiConsumer(sinks, record, state=state)
    return run_front(cfg, rdv, options, _Announcing(consumer, record, rdv)), printer


class _Announcing:
    """Once the store is up and the ranks started: one line on stderr, and where the job is recorded in its store
    (`ddptop attach` shows it). Before that, a failure (a port in use) is the only line."""

    def __init__(self, consumer, path: str | None, rdv: Rendezvous):
        self.consumer, self.path, self.rdv = consumer, path, rdv

    def __call__(self, source, job) -> None:
        from ddptop.control import store as stores
        from ddptop.front.recording import announce

        rdv = self.rdv
        print(f"ddptop: {rdv.world_size} ranks, master {rdv.master}:{job.front.port} (ranks found by {rdv.source})"
              + (f"; recording to {self.path}" if self.path else "; not recording"), file=sys.stderr)
        try:
            announce(stores.ddptop_view(stores.connect(job.front.master, job.front.port, 5, "front")), self.path)
        except Exception:  # attach then says it does not know: nothing here depends on it
            pass
        self.consumer(source, job)

    def finish(self, source, job) -> None:
        self.consumer.finish(source, job)


def _terminal() -> bool:
    """The live screen needs a terminal on both ends; without one (a pipe, CI) the run goes on headless."""
    if sys.stdin.isatty() and sys.stdout.isatty():
        return True
    print("ddptop: no terminal for the live screen; running headless (--headless skips this note)", file=sys.stderr)
    return False

