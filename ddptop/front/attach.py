"""Provides `ddptop attach`'s front: a running job this process did not start (AttachedJob), watched through the pipeline."""

from __future__ import annotations

import sys
import time

from ddptop.control.announce import announced
from ddptop.control.hub import Subscriber
from ddptop.errors import OutputClosed
from ddptop.events import RunFinished
from ddptop.front.feed import SharedState
from ddptop.front.headless import HeadlessConsumer, HeadlessPrinter
from ddptop.front.pipeline import compose
from ddptop.front.prometheus import job_name, serve
from ddptop.front.supervisor import FrontInfo


class AttachedJob:
    """A job this process did not start: alive until every rank finished or the store stops answering."""

    attached = True  # the screen's `q` detaches instead of stopping the ranks

    def __init__(self, client, world_size: int):
        self.front = FrontInfo(client.master, client.port, client.token, client.prefix)
        self.client = client
        self.world_size = world_size
        self.finished: set[int] = set()
        self.gone = False
        self._next_check = 0.0

    def handle(self, events) -> None:
        """A sink of the pipeline: the job is over once every rank has said it finished."""
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



def watch(client, headless: bool, log_every: int, metrics: tuple[int, str] | None = None) -> None:
    """Watch the job `client` found until it ends or the user leaves (KeyboardInterrupt reaches the caller);
    `metrics` (--metrics-port, --metrics-addr): serve its figures to Prometheus from this machine meanwhile."""
    world = client.status()["world_size"]  # checked: signed by rank 0, 1..65536
    job = AttachedJob(client, world)
    recording = announced(client)
    said = {None: "the job did not say whether it records", "": "the job does not record"}.get(
        recording, f"the job records to {recording}")
    print(f"ddptop: attached to {client.master}:{client.port} ({world} ranks; {said}); Ctrl-C detaches",
          file=sys.stderr)
    printer = HeadlessPrinter(every=log_every) if headless else None
    state = printer.state if printer else SharedState()
    endpoint = serve(state, *metrics, job=job_name(recording, f"{client.master}:{client.port}")) if metrics else None
    try:
        _watch(client, job, world, state, printer, endpoint, recording)
    finally:
        if endpoint is not None:
            endpoint.close()


def _watch(client, job: AttachedJob, world: int, state: SharedState, printer, endpoint, recording) -> None:
    subscriber = Subscriber(client.master, client.ports["pub"], client.session.job, world)
    sinks = [job] + ([endpoint.exporter] if endpoint is not None else [])
    feed = compose(subscriber.source, world_size=world, liveness=subscriber.liveness, sinks=sinks, state=state)
    if printer is not None:
        consumer = HeadlessConsumer(printer)
    else:
        from ddptop.front.screen import ScreenConsumer

        consumer = ScreenConsumer(recording=recording or None)
    try:
        consumer(feed, job)
    except OutputClosed as exc:  # `ddptop attach --headless | head`: the reader left, the job goes on
        raise OutputClosed(f"{exc}: detached; the job goes on") from None
    finally:
        feed.stop()
