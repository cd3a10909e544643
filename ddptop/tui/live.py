"""Provides TuiConsumer: the live screen as the front's consumer, beside the feed that records the job."""

from __future__ import annotations

from typing import Sequence

from ddptop.control.client import ControlClient
from ddptop.front.feed import Feed, SharedState


class TuiConsumer:
    """Runs the app in the front's main thread (the ranks are other processes, so drawing never slows a step).

    The feed runs on its own thread: the recording gets every event whether or not the screen keeps up. `q` in
    the app asks the ranks to stop and leaves once they have; `finish` then drains the feed, so nothing the ranks
    sent is lost. `recording` is what the header shows (attached: the job's own recording, or None).
    """

    def __init__(self, sinks: Sequence = (), recording: str | None = None, total_steps: int = 0,
                 state: SharedState | None = None):
        self.sinks = list(sinks)
        self.recording, self.total_steps = recording, total_steps
        self.state = state or SharedState()
        self.feed: Feed | None = None

    def __call__(self, source, job) -> None:
        from ddptop.tui.app import DdptopApp  # textual loads only when the screen is wanted

        self.feed = Feed(source, self.sinks, job=job, state=self.state).start()
        front = job.front
        connect = (lambda: ControlClient(front.master, front.port, front.token, role="tui", prefix=front.prefix)
                   if front else None)
        app = DdptopApp(self.feed, mode="live", job=job, connect=connect, recording=self.recording,
                        total_steps=self.total_steps)
        app.run()
        self.finish(source, job)

    def finish(self, source, job) -> None:
        if self.feed is None:  # interrupted before the screen started
            self.feed = Feed(source, self.sinks, job=job, state=self.state)
        self.feed.stop()
