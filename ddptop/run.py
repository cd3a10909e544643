"""Starting a run in the right shape for where the ranks were found: a front process, or this process as a rank."""

from __future__ import annotations

import sys

from ddptop.config import RunConfig
from ddptop.control.token import remove_job_file, resolve_token, write_job_file
from ddptop.headless import HeadlessConsumer, HeadlessPrinter
from ddptop.train.rendezvous import Rendezvous
from ddptop.train.worker import WorkerOptions


def open_recording(path: str | None, cfg: RunConfig, rdv: Rendezvous):
    """`--record FILE`: a RecordingWriter sink, created before any rank starts so a bad path fails first."""
    if not path:
        return None
    from ddptop.record.sqlite import RecordingWriter, base_meta

    where = {"source": rdv.source, "world_size": rdv.world_size, "master": rdv.master, "rank": rdv.rank}
    return RecordingWriter(path, base_meta(cfg.to_dict(), where))


def run(cfg: RunConfig, rdv: Rendezvous, timeout_s: float, log_every: int, token: str | None = None,
        record: str | None = None, headless: bool = True) -> int:
    if record and rdv.rank != 0:
        print(f"ddptop: rank {rdv.rank} leaves --record to rank 0, which records every rank", file=sys.stderr)
        record = None
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
    print("ddptop: no terminal for the live screen; running headless (--headless skips this note)", file=sys.stderr)
    return False


def run_direct(cfg: RunConfig, rdv: Rendezvous, options: WorkerOptions, printer: HeadlessPrinter,
               recorder=None) -> int:
    """This process is one rank (a worker machine, torchrun, Slurm). Rank 0 also prints the job's progress."""
    from ddptop.train.worker import run_rank

    print(f"ddptop: rank {rdv.rank} of {rdv.world_size}, master {rdv.master}:{rdv.port} "
          f"(ranks found by {rdv.source})", file=sys.stderr)
    server = watcher = None
    if rdv.rank == 0 and rdv.source != "flags" and not rdv.agent_store:
        from ddptop.control import store as stores

        server = stores.serve(rdv.port, rdv.master)  # kept until every rank has sent its last events
    if rdv.rank == 0:  # without a front process, rank 0 collects every rank's events for printing and recording
        watcher = _Watcher(rdv, options.timeout_s, [printer] + ([recorder] if recorder else []))
        write_job_file(rdv.master, rdv.port, options.token, rdv.world_size, rdv.key_prefix)
    try:
        steps = run_rank(cfg, rdv, options)
    finally:
        if watcher is not None:
            watcher.stop(wait_for=lambda: len(printer.finished) >= rdv.world_size)
            remove_job_file(rdv.port)
        del server
    print(f"ddptop: rank {rdv.rank} finished {steps} steps", file=sys.stderr)
    return 0



class _Watcher:
    """A thread in rank 0's process (torchrun, Slurm): collects the job's events from the store into sinks.

    It connects when rank 0 has started the store, and drains once more after training ends."""

    def __init__(self, rdv: Rendezvous, timeout_s: float, sinks: list):
        import threading

        self.rdv, self.timeout_s, self.sinks = rdv, timeout_s, sinks
        self.source = None
        self._halt = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ddptop-watch", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        from ddptop.control import store as stores
        from ddptop.control.bus import Collector, LiveSource

        try:
            view = stores.ddptop_view(stores.connect(self.rdv.master, self.rdv.port, self.timeout_s, self.rdv.source),
                                      self.rdv.key_prefix)
        except Exception:  # rank 0 itself reports a store it cannot reach
            return
        self.source = LiveSource(Collector(view, self.rdv.world_size))
        while not self._halt.wait(0.2):
            self._feed(self.source.poll())

    def _feed(self, events) -> None:
        for sink in self.sinks:
            sink.handle(events)

    def stop(self, wait_for=lambda: True, grace_s: float = 10.0) -> None:
        """Stop once `wait_for()` holds (every rank finished) or after `grace_s`, then drain the last events."""
        import time

        deadline = time.monotonic() + grace_s
        while not wait_for() and time.monotonic() < deadline and self._thread.is_alive():
            time.sleep(0.1)
        self._halt.set()
        self._thread.join(timeout=10)
        if self.source is not None:
            self.source.close()
            self._feed(self.source.poll())
