"""Provides ScreenConsumer: the live screen as the front's consumer, beside the feed that records the job."""

from __future__ import annotations

from ddptop.control.client import ControlClient
from ddptop.front.feed import Feed


class ScreenConsumer:
    """Runs the app in the front's main thread (the ranks are other processes, so drawing never slows a step).

    The feed runs on its own thread: the recording gets every event whether or not the screen keeps up. `q` in
    the app asks the ranks to stop and leaves once they have; `finish` then drains the feed, so nothing the ranks
    sent is lost. `recording` is what the header shows (attached: the job's own recording, or None).
    """

    def __init__(self, recording: str | None = None, total_steps: int = 0):
        self.recording, self.total_steps = recording, total_steps

    def __call__(self, feed: Feed, job) -> None:
        from ddptop.tui.app import DdptopApp  # textual loads only when the screen is wanted

        feed.start()
        front = job.front
        connect = (lambda: ControlClient(front.master, front.port, front.token, role="tui", prefix=front.prefix)
                   if front else None)
        DdptopApp(feed, mode="live", job=job, connect=connect, recording=self.recording,
                  total_steps=self.total_steps).run()
        self.finish(feed, job)

    def finish(self, feed: Feed, job) -> None:
        feed.stop()
