"""`ddptop ctl status` finds a rank's newest steps however many batches came after them (issue 26: a lab's 2-7 s
steps are followed by a batch of system samples every 0.5 s, and the 3 newest batches held no step: "(no recent
step in the store)" for ranks that were stepping). A real channel, a real rank publisher, events in between."""

from __future__ import annotations

import time

from ddptop.cli.ctl import recent_steps
from ddptop.control.bus import Publisher
from ddptop.control.channel import ChannelClient
from ddptop.events import LogLine, StepDone
from jobchannel import Served, job_keys

JOB = job_keys("ctl-recent-steps-token", "ef" * 16)


def test_status_reads_back_past_batches_that_hold_no_step():
    served = Served(JOB)
    publisher = Publisher(ChannelClient("127.0.0.1", served.channel.port, JOB.ranks, b"ranks", 10), 0, JOB,
                          interval_s=0.02)
    try:
        for n in range(3):
            publisher.emit(StepDone(0, n, 0, 0, time.time(), 4.0, 0.0, 3.9, 0.0, 0.0, 0.0, 64, 2.3, 0, 0, 0, False))
        publisher.flush()
        first = publisher.seq
        for n in range(8):  # one batch each: what a long step's system samples are
            publisher.emit(LogLine(0, "info", f"sample {n}", time.time()))
            publisher.flush()
        assert publisher.seq == first + 8
        steps = recent_steps(served.client(), JOB, 1)
        assert [d.step for d in steps[0]] == [0, 1, 2]
    finally:
        publisher.close()
        served.close()
