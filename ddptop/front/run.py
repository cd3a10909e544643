"""Starting a run in the right shape for where the ranks were found: a front process, or this process as a rank."""

from __future__ import annotations

import sys

from ddptop.config import RunConfig
from ddptop.control.auth import token_bytes
from ddptop.control.token import STRONG_TOKEN_BYTES, private_jobs_dir, resolve_token
from ddptop.errors import RecordingExists, say_line
from ddptop.front.feed import SharedState
from ddptop.front.recording import RecorderAlarm, end_recording, open_recording
from ddptop.record.paths import another, closing_lines
from ddptop.front.headless import HeadlessConsumer, HeadlessPrinter
from ddptop.front.prometheus import job_name, serve
from ddptop.safe import clean
from ddptop.rendezvous import Rendezvous
from ddptop.train.worker import WorkerOptions


def where(rdv: Rendezvous) -> dict:
    return {"source": rdv.source, "world_size": rdv.world_size, "master": rdv.master, "rank": rdv.rank}


def records_here(rdv: Rendezvous) -> bool:
    """Rank 0 records every rank (its front process, or under torchrun/Slurm its collector process)."""
    return rdv.rank == 0 or rdv.source == "local"


def run(cfg: RunConfig, rdv: Rendezvous, timeout_s: float, log_every: int, token: str | None = None,
        record: str | None = None, headless: bool = True, record_required: bool = False,
        lost_after_s: float = 10.0, fresh_name: bool = False, collective_timeout_s: float = 300.0,
        tune: str = "", metrics: tuple[int, str] | None = None) -> int:
    """`fresh_name`: `record` is a name ddptop chose (the runs folder's), so another run that took it in the same
    second moves this one to the next free name instead of failing. `collective_timeout_s`: the process groups'
    timeout, after which a collective that waits on a peer fails (PeerLost, exit 5). `tune`: --tune's "bucket" or
    "strategy" ("": none).
    `metrics`: --metrics-port and --metrics-addr, the Prometheus endpoint this front serves (front.prometheus)."""
    if records_here(rdv):
        private_jobs_dir()  # where this process will leave the job file: refused now, before a rank or file starts
    if record and not records_here(rdv):
        say_line(f"ddptop: rank {rdv.rank} leaves the recording to rank 0, which records every rank")
        record = None
    if metrics and not records_here(rdv):
        say_line(f"ddptop: rank {rdv.rank} leaves --metrics-port to rank 0, whose front serves every rank's figures")
        metrics = None
    options = rank_options(rdv, token, timeout_s, lost_after_s, collective_timeout_s)
    if not (rdv.source == "local" or (rdv.source == "flags" and rdv.rank == 0)):
        from ddptop.record.paths import check_new
        from ddptop.train.direct import run_direct

        if record:
            check_new(record)  # refused before this rank trains, like a front's recording
        return run_direct(cfg, rdv, options, log_every, record, record_required)
    state = SharedState()
    # before the recording: a port in use leaves no file; the job's label is final once its store's port is known
    endpoint = serve(state, *metrics, job=job_name(record, "ddptop")) if metrics else None
    try:
        code, printer, kept, record = _record_front(cfg, rdv, options, log_every, state, headless, record,
                                                    record_required, fresh_name, tune, endpoint)
    finally:
        if endpoint is not None:
            endpoint.close()
    if kept:
        snap = state.snapshot()
        for line in closing_lines(record, snap.step, len(snap.ranks)):
            print(line, flush=True)
    if code != 0:
        # a rank a signal ended first: the others' exits (5, a peer lost) followed from it
        first = sorted(printer.lost.values(), key=lambda e: ("killed by signal" not in e.reason, e.rank)) \
            if printer else []
        lost = "; ".join(f"rank {e.rank} {e.reason}" for e in first)
        print(f"ddptop: the job failed{': ' + lost if lost else ''} (exit code {code})", file=sys.stderr)
    return code


def _record_front(cfg: RunConfig, rdv: Rendezvous, options: WorkerOptions, log_every: int, state: SharedState,
                  headless: bool, record: str | None, record_required: bool, fresh_name: bool, tune: str,
                  endpoint) -> tuple:
    """Open the recording (the next free name when ddptop chose it and another run took it), run the front, close
    the recording whatever happens: (exit code, printer, whether the file is kept, its path)."""
    alarm = RecorderAlarm(record or "", record_required)
    while True:
        try:
            recorder = open_recording(record, cfg.to_dict(), where(rdv), alarm)
            break
        except RecordingExists:
            if not fresh_name:
                raise
            record = alarm.path = another(record)
    exporter = endpoint.exporter if endpoint is not None else None
    try:
        code, printer = _run_front(cfg, rdv, options, log_every, state, recorder, headless, record, alarm, tune,
                                   exporter)
    finally:  # errors and Ctrl-C too: what was received is written
        kept = end_recording(recorder, record, record_required)
    return code, printer, kept, record


def rank_options(rdv: Rendezvous, token: str | None, timeout_s: float, lost_after_s: float,
                 collective_timeout_s: float, token_by: str = "--token") -> WorkerOptions:
    """The job token (typed, DDPTOP_TOKEN, or a new one) and the ranks' options; rank 0 says when the token is
    weak or missing (the user's own loop, ddptop/api.py, starts its job here too). `token_by`: how this user
    gives a token (the command line's --token; the API's join(token=...))."""
    token_value, given = resolve_token(token)
    options = WorkerOptions(timeout_s=timeout_s, token=token_value, check_token=given or rdv.source == "local",
                            lost_after_s=lost_after_s, pg_timeout_s=collective_timeout_s)
    if given and rdv.rank == 0 and len(token_bytes(token_value)) < STRONG_TOKEN_BYTES:
        print(f"ddptop: the job token is {len(token_bytes(token_value))} bytes: one of {STRONG_TOKEN_BYTES} or more "
              "random bytes resists offline guessing (docs/explanation/trust-model.md)", file=sys.stderr)
    if not options.check_token and rdv.world_size > 1 and rdv.rank == 0:  # said where the job's store lives
        print(f"ddptop: no job token ({token_by} or DDPTOP_TOKEN): anyone who reaches port {rdv.port} can join "
              f"this job or disturb its start; give every rank the same {token_by}", file=sys.stderr)
    return options


def _run_front(cfg: RunConfig, rdv: Rendezvous, options: WorkerOptions, log_every: int, state: SharedState,
               recorder, headless: bool, record: str | None, alarm: RecorderAlarm, tune: str = "",
               exporter=None):
    """This machine hosts the store and starts its ranks; the pipeline records and shows them (screen or lines)."""
    from ddptop.front.supervisor import run_front

    printer = None
    if headless or not _terminal():
        printer = HeadlessPrinter(every=log_every, state=state)  # the total comes with rank 0's RunStarted
        consumer = HeadlessConsumer(printer)
    else:
        from ddptop.front.screen import ScreenConsumer

        consumer = ScreenConsumer(record)
    def started(job) -> None:
        _started(alarm, job, record, rdv)
        if exporter is not None:  # the store's port is known now (--local binds a free one)
            exporter.job = job_name(record, f"{rdv.master}:{job.front.port}")

    sinks = [s for s in (recorder, exporter) if s is not None]
    code = run_front(cfg, rdv, options, consumer, sinks=sinks, state=state, alarm=alarm, on_start=started, tune=tune)
    return code, printer


def _started(alarm: RecorderAlarm, job, path: str | None, rdv: Rendezvous) -> None:
    """Once the store is up and the ranks started: one line on stderr, where the job is recorded in its store
    (`ddptop attach` shows it), and what a failed --record-required recording does. Before that, a failure (a port
    in use) is the only line."""
    from ddptop.control.announce import announce

    def stop() -> None:
        from ddptop.control.client import ControlClient

        job.stop()
        try:
            ControlClient(job.front.master, job.front.port, job.front.token, role="front").request("stop")
        except Exception as exc:  # rank 0 does not answer yet: terminating is the stop
            print(f"ddptop: rank 0 did not take the stop ({clean(str(exc), 200)}); terminating the ranks",
                  file=sys.stderr)
            job.terminate()

    alarm.stop = stop
    print(f"ddptop: {rdv.world_size} ranks, master {rdv.master}:{job.front.port} (ranks found by {rdv.source})"
          + (f"; recording to {path}" if path else "; not recording"), file=sys.stderr)
    announce(job.hub, path)


def _terminal() -> bool:
    """The live screen needs a terminal on both ends; without one (a pipe, CI) the run goes on headless."""
    if sys.stdin.isatty() and sys.stdout.isatty():
        return True
    print("ddptop: no terminal for the live screen; running headless (--headless skips this note)", file=sys.stderr)
    return False

