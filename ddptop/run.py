"""Starting a run in the right shape for where the ranks were found: a front process, or this process as a rank."""

from __future__ import annotations

import os
import sys
import time

from ddptop.config import RunConfig
from ddptop.control.token import resolve_token
from ddptop.errors import RecordingError, RecordingExists
from ddptop.events import RecorderFailed
from ddptop.front.feed import SharedState
from ddptop.front.recording import another, closing_lines
from ddptop.headless import HeadlessConsumer, HeadlessPrinter
from ddptop.safe import clean
from ddptop.train.rendezvous import Rendezvous
from ddptop.train.worker import WorkerOptions


class RecorderAlarm:
    """What happens when the recording fails mid-run: an event in the job's stream (the printer and the screen
    show it), and with --record-required a stop request, so the job ends cleanly (exit 6) instead of going on."""

    def __init__(self, path: str, required: bool):
        self.path, self.required = path, required
        self.source = None  # the LiveSource, once the job's stream exists
        self.stop = None  # asks the ranks to stop

    def __call__(self, reason: str) -> None:  # the recorder's thread
        event = RecorderFailed(self.path, clean(reason, 200), self.required, time.time())
        if self.source is not None:
            self.source.inject([event])
        else:
            print(f"ddptop: recording to {self.path} stopped: {event.reason}", file=sys.stderr, flush=True)
        if self.required and self.stop is not None:
            self.stop()


def open_recording(path: str | None, cfg: RunConfig, rdv: Rendezvous, alarm: RecorderAlarm | None = None):
    """`--record FILE` (or the default file): a RecordingWriter sink, created before any rank starts so a bad path
    fails first."""
    if not path:
        return None
    from ddptop.record.sqlite import RecordingWriter, base_meta

    return RecordingWriter(path, base_meta(cfg.to_dict(), where(rdv)), on_error=alarm)


def end_recording(recorder, path: str, required: bool) -> bool:
    """Close the recording (a run that never started leaves no file); say what a failed writer kept.
    True when the file exists and is worth a report."""
    if recorder is None:
        return False
    recorder.discard()
    if recorder.error:
        if required:
            raise RecordingError(f"recording {path} failed ({clean(recorder.error, 200)}); the job was stopped "
                                 "(--record-required)")
        print(f"ddptop: recording {path} is incomplete ({clean(recorder.error, 200)}): it keeps everything "
              "before that; training went on", file=sys.stderr)
    return os.path.exists(path)


def where(rdv: Rendezvous) -> dict:
    return {"source": rdv.source, "world_size": rdv.world_size, "master": rdv.master, "rank": rdv.rank}


def records_here(rdv: Rendezvous) -> bool:
    """Rank 0 records every rank (its front process, or under torchrun/Slurm its collector process)."""
    return rdv.rank == 0 or rdv.source == "local"


def run(cfg: RunConfig, rdv: Rendezvous, timeout_s: float, log_every: int, token: str | None = None,
        record: str | None = None, headless: bool = True, record_required: bool = False,
        lost_after_s: float = 10.0, fresh_name: bool = False) -> int:
    """`fresh_name`: `record` is a name ddptop chose (the runs folder's), so another run that took it in the same
    second moves this one to the next free name instead of failing."""
    if record and not records_here(rdv):
        print(f"ddptop: rank {rdv.rank} leaves the recording to rank 0, which records every rank", file=sys.stderr)
        record = None
    token_value, given = resolve_token(token)
    options = WorkerOptions(timeout_s=timeout_s, token=token_value, check_token=given or rdv.source == "local",
                            lost_after_s=lost_after_s)
    if not options.check_token and rdv.world_size > 1 and rdv.rank == 0:  # said where the job's store lives
        print(f"ddptop: no job token (--token or DDPTOP_TOKEN): anyone who reaches port {rdv.port} can join this "
              "job or disturb its start; give every rank the same --token", file=sys.stderr)
    if not (rdv.source == "local" or (rdv.source == "flags" and rdv.rank == 0)):
        from ddptop.front.watch import run_direct

        return run_direct(cfg, rdv, options, log_every, record, record_required)
    state = SharedState()
    alarm = RecorderAlarm(record or "", record_required)
    while True:
        try:
            recorder = open_recording(record, cfg, rdv, alarm)
            break
        except RecordingExists:
            if not fresh_name:
                raise
            record = alarm.path = another(record)
    try:
        code, printer = _run_front(cfg, rdv, options, log_every, state, recorder, headless, record, alarm)
    finally:  # errors and Ctrl-C too: what was received is written
        kept = end_recording(recorder, record, record_required)
    if kept:
        snap = state.snapshot()
        for line in closing_lines(record, snap.step, len(snap.ranks)):
            print(line, flush=True)
    if code != 0:
        lost = "; ".join(f"rank {e.rank} {e.reason}" for e in printer.lost.values()) if printer else ""
        print(f"ddptop: the job failed{': ' + lost if lost else ''} (exit code {code})", file=sys.stderr)
    return code


def _run_front(cfg: RunConfig, rdv: Rendezvous, options: WorkerOptions, log_every: int, state: SharedState,
               recorder, headless: bool, record: str | None, alarm: RecorderAlarm):
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
    return run_front(cfg, rdv, options, _Announcing(consumer, record, rdv),
                     on_source=lambda source, job: _arm(alarm, source, job)), printer


def _arm(alarm: RecorderAlarm, source, job) -> None:
    def stop() -> None:
        from ddptop.control.client import ControlClient

        job.stop()
        try:
            ControlClient(job.front.master, job.front.port, job.front.token, role="front").request("stop")
        except Exception:  # rank 0 does not answer yet: terminating is the stop
            job.terminate()

    alarm.source, alarm.stop = source, stop


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
            store = stores.connect(job.front.master, job.front.port, 5, "front")
            announce(stores.job_view(store, "", job.keys.namespace), job.keys, self.path)
        except Exception as exc:  # attach then says it does not know: nothing here depends on it
            print(f"ddptop: could not announce the recording to the job's store ({type(exc).__name__}: "
                  f"{clean(str(exc), 200)}); `ddptop attach` will not know where it goes", file=sys.stderr)
        self.consumer(source, job)

    def finish(self, source, job) -> None:
        self.consumer.finish(source, job)


def _terminal() -> bool:
    """The live screen needs a terminal on both ends; without one (a pipe, CI) the run goes on headless."""
    if sys.stdin.isatty() and sys.stdout.isatty():
        return True
    print("ddptop: no terminal for the live screen; running headless (--headless skips this note)", file=sys.stderr)
    return False

