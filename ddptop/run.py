"""Starting a run in the right shape for where the ranks were found: a front process, or this process as a rank."""

from __future__ import annotations

import sys
import time
from dataclasses import replace

from ddptop.config import RunConfig
from ddptop.control.auth import JobKeys, new_job_id
from ddptop.control.token import remove_job_file, resolve_token, write_job_file
from ddptop.errors import RecordingError
from ddptop.events import RecorderFailed
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
    """`--record FILE`: a RecordingWriter sink, created before any rank starts so a bad path fails first."""
    if not path:
        return None
    from ddptop.record.sqlite import RecordingWriter, base_meta

    where = {"source": rdv.source, "world_size": rdv.world_size, "master": rdv.master, "rank": rdv.rank}
    return RecordingWriter(path, base_meta(cfg.to_dict(), where), on_error=alarm)


def run(cfg: RunConfig, rdv: Rendezvous, timeout_s: float, log_every: int, token: str | None = None,
        record: str | None = None, headless: bool = True, record_required: bool = False,
        lost_after_s: float = 10.0) -> int:
    if record and rdv.rank != 0:
        print(f"ddptop: rank {rdv.rank} leaves --record to rank 0, which records every rank", file=sys.stderr)
        record = None
    alarm = RecorderAlarm(record or "", record_required)
    recorder = open_recording(record, cfg, rdv, alarm)
    try:
        code = _run(cfg, rdv, timeout_s, log_every, token, recorder, headless, record, alarm, lost_after_s)
    finally:
        if recorder is not None:  # errors and Ctrl-C too: what was received is written; a run that never
            recorder.discard()  # started (no event) leaves no file
    if recorder is not None and recorder.error:
        if record_required:
            raise RecordingError(f"recording {record} failed ({clean(recorder.error, 200)}); the job was stopped "
                                 "(--record-required)")
        print(f"ddptop: recording {record} is incomplete ({clean(recorder.error, 200)}): it keeps everything "
              "before that; training went on", file=sys.stderr)
    return code


def _run(cfg: RunConfig, rdv: Rendezvous, timeout_s: float, log_every: int, token: str | None, recorder,
         headless: bool, record: str | None, alarm: RecorderAlarm, lost_after_s: float = 10.0) -> int:
    token_value, given = resolve_token(token)
    options = WorkerOptions(timeout_s=timeout_s, token=token_value, check_token=given or rdv.source == "local",
                            lost_after_s=lost_after_s)
    if not options.check_token and rdv.world_size > 1:
        print(f"ddptop: no job token (--token or DDPTOP_TOKEN): anyone who reaches port {rdv.port} can join this "
              "job or disturb its start; give every rank the same --token", file=sys.stderr)
    printer = HeadlessPrinter(every=log_every)  # the total comes with rank 0's RunStarted
    if rdv.source == "local" or (rdv.source == "flags" and rdv.rank == 0):
        from ddptop.train.launch import run_front

        print(f"ddptop: {rdv.world_size} ranks, master {rdv.master} (ranks found by {rdv.source})", file=sys.stderr)
        sinks = [recorder] if recorder else []
        if headless or not _terminal():
            consumer = HeadlessConsumer(printer, sinks)
        else:
            from ddptop.tui.live import TuiConsumer

            consumer = TuiConsumer(sinks, record)
        code = run_front(cfg, rdv, options, consumer, on_source=lambda source, job: _arm(alarm, source, job))
        if code != 0:
            lost = "; ".join(f"rank {e.rank} {e.reason}" for e in printer.lost.values())
            print(f"ddptop: the job failed{': ' + lost if lost else ''} (exit code {code})", file=sys.stderr)
        return code
    return run_direct(cfg, rdv, options, printer, recorder, alarm)


def _arm(alarm: RecorderAlarm, source, job) -> None:
    def stop() -> None:
        from ddptop.control.client import ControlClient

        job.stop()
        try:
            ControlClient(job.front.master, job.front.port, job.front.token, role="front").request("stop")
        except Exception:  # rank 0 does not answer yet: terminating is the stop
            job.terminate()

    alarm.source, alarm.stop = source, stop


def _terminal() -> bool:
    """The live screen needs a terminal on both ends; without one (a pipe, CI) the run goes on headless."""
    if sys.stdin.isatty() and sys.stdout.isatty():
        return True
    print("ddptop: no terminal for the live screen; running headless (--headless skips this note)", file=sys.stderr)
    return False


def run_direct(cfg: RunConfig, rdv: Rendezvous, options: WorkerOptions, printer: HeadlessPrinter,
               recorder=None, alarm: RecorderAlarm | None = None) -> int:
    """This process is one rank (a worker machine, torchrun, Slurm). Rank 0 also prints the job's progress."""
    from ddptop.train.worker import run_rank

    print(f"ddptop: rank {rdv.rank} of {rdv.world_size}, master {rdv.master}:{rdv.port} "
          f"(ranks found by {rdv.source})", file=sys.stderr)
    server = watcher = None
    if rdv.rank == 0 and rdv.source != "flags" and not rdv.agent_store:
        from ddptop.control import store as stores

        server = stores.serve(rdv.port, rdv.master)  # kept until every rank has sent its last events
    if rdv.rank == 0:  # without a front process, rank 0 collects every rank's events for printing and recording
        options = replace(options, job_id=new_job_id())
        watcher = _Watcher(rdv, options, [printer] + ([recorder] if recorder else []), alarm)
        write_job_file(rdv.master, rdv.port, options.token, rdv.world_size, rdv.key_prefix)
    try:
        steps = run_rank(cfg, rdv, options)
    finally:
        if watcher is not None:
            watcher.stop(wait_for=lambda: len(printer.finished) >= rdv.world_size)
            remove_job_file(rdv.master, rdv.port)
        del server
    print(f"ddptop: rank {rdv.rank} finished {steps} steps", file=sys.stderr)
    return 0


class _Watcher:
    """A thread in rank 0's process (torchrun, Slurm): collects the job's events from the store into sinks.

    It connects when rank 0 has started the store, and drains once more after training ends."""

    def __init__(self, rdv: Rendezvous, options: WorkerOptions, sinks: list, alarm: RecorderAlarm | None):
        import threading

        self.rdv, self.options, self.sinks, self.alarm = rdv, options, sinks, alarm
        self.source = None
        self._halt = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ddptop-watch", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        from ddptop.control import store as stores
        from ddptop.control.bus import Collector, LiveSource

        rdv, keys = self.rdv, JobKeys.from_token(self.options.token, self.options.job_id)
        try:
            view = stores.job_view(stores.connect(rdv.master, rdv.port, self.options.timeout_s, rdv.source),
                                   rdv.key_prefix, keys.namespace)
        except Exception:  # rank 0 itself reports a store it cannot reach
            return
        self.source = LiveSource(Collector(view, rdv.world_size, keys))
        if self.alarm is not None:
            self.alarm.source, self.alarm.stop = self.source, self._stop_job
        while not self._halt.wait(0.2):
            self._feed(self.source.poll())

    def _stop_job(self) -> None:
        from ddptop.control.client import ControlClient

        try:
            ControlClient(self.rdv.master, self.rdv.port, self.options.token, role="front",
                          prefix=self.rdv.key_prefix).request("stop")
        except Exception:
            pass

    def _feed(self, events) -> None:
        for sink in self.sinks:
            sink.handle(events)

    def stop(self, wait_for=lambda: True, grace_s: float = 10.0) -> None:
        """Stop once `wait_for()` holds (every rank finished) or after `grace_s`, then drain the last events."""
        deadline = time.monotonic() + grace_s
        while not wait_for() and time.monotonic() < deadline and self._thread.is_alive():
            time.sleep(0.1)
        self._halt.set()
        self._thread.join(timeout=10)
        if self.source is not None:
            self.source.close()
            self._feed(self.source.poll())
