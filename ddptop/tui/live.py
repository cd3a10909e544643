"""Provides TuiConsumer: the live screen as the front process's consumer, feeding every event to the run's sinks."""

from __future__ import annotations

from typing import Sequence

from ddptop.control.client import ControlClient


class TuiConsumer:
    """Runs the app in the front's main thread (the ranks are other processes, so drawing never slows a step).

    `q` in the app asks the ranks to stop and leaves once they have; `finish` then hands the last events
    to the sinks (the recording) so nothing the ranks sent is lost.
    """

    def __init__(self, sinks: Sequence = (), recording: str | None = None, total_steps: int = 0):
        self.sinks = list(sinks)
        self.recording, self.total_steps = recording, total_steps

    def __call__(self, source, job) -> None:
        from ddptop.tui.app import DdptopApp  # textual loads only when the screen is wanted

        front = job.front
        connect = (lambda: ControlClient(front.master, front.port, front.token, role="tui", prefix=front.prefix)
                   if front else None)
        app = DdptopApp(source, mode="live", job=job, sinks=self.sinks, connect=connect, recording=self.recording,
                        total_steps=self.total_steps)
        app.run()
        self.finish(source, job)

    def finish(self, source, job) -> None:
        source.close()
        events = source.poll() + job.lost_events()
        for sink in self.sinks:
            sink.handle(events)
