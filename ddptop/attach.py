"""`ddptop attach`: watch a running job from another terminal or machine; leaving never stops it."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Sequence

from ddptop.errors import UsageError


class AttachedJob:
    """A job this process did not start: alive until every rank finished or the store stops answering."""

    attached = True  # the screen's `q` detaches instead of stopping the ranks

    def __init__(self, client, world_size: int):
        from ddptop.train.launch import FrontInfo

        self.front = FrontInfo(client.master, client.port, client.token, client.prefix)
        self.client = client
        self.world_size = world_size
        self.finished: set[int] = set()
        self.gone = False
        self._next_check = 0.0

    def note(self, events) -> None:
        from ddptop.events import RunFinished

        self.finished.update(e.rank for e in events if isinstance(e, RunFinished))

    def alive(self) -> bool:
        if self.gone or len(self.finished) >= self.world_size:
            return False
        if time.monotonic() >= self._next_check:
            self._next_check = time.monotonic() + 2.0
            try:
                self.client.status()
            except Exception:
                self.gone = True
        return not self.gone

    def check(self) -> None:
        pass

    def lost_events(self) -> list:
        return []


def parser() -> argparse.ArgumentParser:
    from ddptop.cli import _Parser, add_job_flags

    p = _Parser(prog="ddptop attach", description="Watch a running ddptop job; Ctrl-C (or q) detaches.")
    add_job_flags(p)
    p.add_argument("--headless", action="store_true", help="progress lines instead of the screen")
    p.add_argument("--log-every", type=int, default=10, metavar="N")
    return p


def cmd_attach(argv: Sequence[str]) -> int:
    args = parser().parse_args(argv)
    if args.log_every < 1:
        raise UsageError("--log-every must be at least 1")
    from ddptop.control import store as stores
    from ddptop.control.bus import Collector, LiveSource, Liveness
    from ddptop.control.client import ControlClient
    from ddptop.headless import HeadlessConsumer, HeadlessPrinter

    from ddptop.cli import check_port

    check_port(args.port)
    client = ControlClient.find(args.master, args.port, args.token, role="attach", prefix=args.prefix)
    world = client.status()["world_size"]  # checked: signed by rank 0, 1..65536
    keys = client.job

    def view():
        return stores.job_view(stores.connect(client.master, client.port, 10, "attach"), client.prefix, keys.namespace)

    source = LiveSource(Collector(view(), world, keys, from_start=False), liveness=Liveness(view(), world, keys))
    job = AttachedJob(client, world)
    from ddptop.front.recording import announced

    recording = announced(client.store, client.token)
    said = {None: "the job did not say whether it records", "": "the job does not record"}.get(
        recording, f"the job records to {recording}")
    print(f"ddptop: attached to {client.master}:{client.port} ({world} ranks; {said}); Ctrl-C detaches",
          file=sys.stderr)
    if args.headless or not (sys.stdin.isatty() and sys.stdout.isatty()):
        consumer = _NoteFinished(HeadlessConsumer(HeadlessPrinter(every=args.log_every)), job)
    else:
        from ddptop.tui.live import TuiConsumer

        consumer = _NoteFinished(TuiConsumer(recording=recording or None), job)
    try:
        consumer(source, job)
    except KeyboardInterrupt:
        print("ddptop: detached; the job goes on", file=sys.stderr)
    finally:
        source.close()
    return 0


class _NoteFinished:
    """Lets the attached job see RunFinished events as they pass to the consumer's sinks."""

    def __init__(self, consumer, job: AttachedJob):
        self.consumer, self.job = consumer, job
        consumer.sinks.append(self)

    def handle(self, events) -> None:
        self.job.note(events)

    def __call__(self, source, job) -> None:
        self.consumer(source, job)
