"""A headless front drains the feed only once it has heard every local rank that exited 0 say it finished: a
fresh-clone CI run beside two busy loops (issue 40) lost rank 0's RunFinished from the recording, because the feed
was drained the moment the ranks' processes had exited while the front had not read their last batch yet.

Real parts: two rank processes that exit 0 (forked), the front's LocalJob over them, its LiveSource, Feed and
HeadlessPrinter. The late read is a RunFinished handed to the source 0.4 s after both processes ended."""

from __future__ import annotations

import io
import multiprocessing
import threading
import time

from ddptop.control.bus import LiveSource
from ddptop.events import RunFinished
from ddptop.front import headless
from ddptop.front.feed import Feed
from ddptop.front.headless import HeadlessConsumer, HeadlessPrinter
from ddptop.front.supervisor import LocalJob


class Kept:
    def __init__(self) -> None:
        self.events: list = []

    def handle(self, events: list) -> None:
        self.events.extend(events)


def test_the_last_rank_heard_late_is_still_recorded_and_said():
    procs = [multiprocessing.get_context("fork").Process(target=lambda: None) for _ in range(2)]
    for p in procs:
        p.start()
    job = LocalJob(procs, [0, 1])
    source, kept = LiveSource(), Kept()
    out = io.StringIO()
    printer = HeadlessPrinter(every=10, out=out, bar=False)
    feed = Feed(source, [kept], state=printer.state)
    source.inject([RunFinished(1, 5, "done", time.time())])

    def late() -> None:  # rank 0's last batch, read after both processes are gone
        for p in procs:
            p.join()
        time.sleep(0.4)
        source.inject([RunFinished(0, 5, "done", time.time())])

    thread = threading.Thread(target=late)
    thread.start()
    HeadlessConsumer(printer)(feed, job)
    thread.join()
    assert sorted(e.rank for e in kept.events if isinstance(e, RunFinished)) == [0, 1]
    assert sorted(printer.finished) == [0, 1]
    assert "finished: 5 steps on 2 ranks (done)" in out.getvalue(), out.getvalue()


def test_a_rank_that_failed_is_not_waited_for():
    procs = [multiprocessing.get_context("fork").Process(target=lambda: None),
             multiprocessing.get_context("fork").Process(target=lambda: exit(3))]
    for p in procs:
        p.start()
        p.join()
    job = LocalJob(procs, [0, 1])
    source = LiveSource()
    source.inject([RunFinished(0, 5, "done", time.time())])
    printer = HeadlessPrinter(every=10, out=io.StringIO(), bar=False)
    feed = Feed(source, [], state=printer.state)
    feed.pump()  # rank 0's RunFinished is heard before the ranks' end is seen
    waited = []
    real = headless.time.sleep

    def counted(seconds: float) -> None:
        waited.append(seconds)
        real(seconds)

    headless.time.sleep = counted
    try:
        HeadlessConsumer(printer)(feed, job)
    finally:
        headless.time.sleep = real
    assert sorted(printer.finished) == [0]
    assert waited == []  # rank 1 exited 3: no RunFinished to wait for, and rank 0's was heard
