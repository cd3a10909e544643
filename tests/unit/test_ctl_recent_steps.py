"""`ddptop ctl status` shows each rank's newest steps however many batches came after them (issue 26: a lab's 2-7 s
steps are followed by a batch of system samples every 0.5 s, and the 3 newest batches held no step: "(no recent
step in the store)" for ranks that were stepping). A real hub, a real rank publisher, events in between."""

from __future__ import annotations

import time

from ddptop.control.bus import Publisher
from ddptop.control.client import ControlClient
from ddptop.events import LogLine, StepDone
from jobchannel import Served, job_keys

TOKEN = "ctl-recent-steps-token"
JOB = job_keys(TOKEN, "ef" * 16)


def test_status_shows_the_newest_steps_past_batches_that_hold_none():
    served = Served(JOB)
    publisher = Publisher(served.rank_socket(), 0, interval_s=0.02)
    try:
        for n in range(13):
            publisher.emit(StepDone(0, n, 0, 0, time.time(), 4.0, 0.0, 3.9, 0.0, 0.0, 0.0, 64, 2.3, 0, 0, 0, False))
        publisher.flush()
        first = publisher.seq
        for n in range(8):  # one batch each: what a long step's system samples are
            publisher.emit(LogLine(0, "info", f"sample {n}", time.time()))
            publisher.flush()
        assert publisher.seq == first + 8
        served.events(lambda got: len(got) >= 21)
        steps = ControlClient("127.0.0.1", served.port, TOKEN).recent_steps()
        assert [d.step for d in steps[0]] == list(range(3, 13))  # the newest ten
    finally:
        publisher.close()
        served.close()
