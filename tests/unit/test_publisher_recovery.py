"""The telemetry publisher against the job's real hub when the front stops reading (a SIGSTOP, a loaded node) and
comes back, when its own queue overflows, and closing under load.

The hub is served as a job serves it; the stall is a real TCP relay between the rank and the hub that stops
reading (bytes wait in the kernel's buffers and then in ZeroMQ's queue, as when the front is stopped), or a link
whose connections are reset.
"""

from __future__ import annotations

import socket
import struct
import threading
import time

import pytest

import ports
from calibrate import Calibrated

from ddptop.control import store as stores
from ddptop.control.bus import CLOSE_WAIT_S, Publisher
from ddptop.events import LogLine, StepDone, TelemetryGap
from jobchannel import Served, job_keys

JOB = job_keys("publisher-recovery-token", "cd" * 16)


@pytest.fixture()
def served():
    job = Served(JOB)
    yield job
    job.close()


def step(n: int) -> StepDone:
    return StepDone(0, n, 0, 0, time.time(), 0.1, 0.0, 0.05, 0.01, 0.0, 0.0, 16, 2.3, 0, 0, 0, False)


class Cable:
    """A TCP link to the real hub that the test holds (nothing read: the far end seems stopped) and lets go."""

    def __init__(self, target: int):
        self.target, self.port = target, ports.port()
        self.flowing = threading.Event()
        self.flowing.set()
        self._listener = socket.create_server(("127.0.0.1", self.port))
        self._listener.settimeout(0.05)
        self._up = True
        threading.Thread(target=self._accept, daemon=True).start()

    def hold(self) -> None:
        self.flowing.clear()

    def release(self) -> None:
        self.flowing.set()

    def close(self) -> None:
        self._up = False
        self.flowing.set()

    def _accept(self) -> None:
        with self._listener:
            while self._up:
                try:
                    near, _ = self._listener.accept()
                except socket.timeout:
                    continue
                far = socket.create_connection(("127.0.0.1", self.target))
                for a, b in ((near, far), (far, near)):
                    threading.Thread(target=_pump, args=(a, b, self.flowing), daemon=True).start()


def _pump(src: socket.socket, dst: socket.socket, flowing: threading.Event) -> None:
    try:
        while True:
            flowing.wait()
            data = src.recv(65536)
            if not data:
                break
            flowing.wait()  # a hold that came while this recv waited holds what it returned too
            dst.sendall(data)
    except OSError:
        pass
    for sock in (src, dst):
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


def steps_of(got: list) -> list[int]:
    return [e.step for e in got if isinstance(e, StepDone)]


def test_a_front_that_stops_reading_for_any_length_receives_every_step_held(served):
    cable = Cable(served.ports["tel"])
    publisher = Publisher(served.rank_socket(cable.port), 0, interval_s=0.05)
    for n in range(20):
        publisher.emit(step(n))
    assert steps_of(served.events(lambda got: len(steps_of(got)) == 20)) == list(range(20))
    cable.hold()
    for n in range(20, 3020):  # the rank trains on while the front reads nothing: ~60 batches wait
        publisher.emit(step(n))
        if n % 50 == 0:
            time.sleep(0.05)
    time.sleep(1.0)
    assert not served.hub.source.poll(), "the hub received nothing while held"
    cable.release()
    got = served.events(lambda got: 3019 in steps_of(got))
    assert steps_of(got) == list(range(20, 3020)) and publisher.dropped == 0
    assert not [e for e in got if isinstance(e, TelemetryGap)]
    publisher.close()
    cable.close()


def test_what_a_full_queue_drops_is_one_gap_and_a_note(served):
    cable = Cable(served.ports["tel"])
    publisher = Publisher(served.rank_socket(cable.port, SNDHWM=1), 0, interval_s=0.05, max_queue=50)
    for n in range(20):
        publisher.emit(step(n))
    assert steps_of(served.events(lambda got: len(steps_of(got)) == 20)) == list(range(20))
    cable.hold()
    for n in range(20, 500):  # the queue keeps the newest 50
        publisher.emit(step(n))
        assert publisher.queued <= 50 + 1  # + one step being resolved
    time.sleep(0.5)
    # how many the socket and the cable's buffers took before the hold filled them depends on this machine's pace
    # (a CI run: 380 dropped of 480, not the 400 once asserted): the count is checked against what arrived below
    assert publisher.dropped > 0
    cable.release()
    for n in range(500, 510):
        publisher.emit(step(n))
    after = served.events(lambda got: 509 in steps_of(got))
    got = steps_of(after)
    assert got[-10:] == list(range(500, 510)), "telemetry resumed"
    assert got == sorted(set(got)) and len(got) + publisher.dropped == 490, "each step once, or counted as dropped"
    gaps = [e for e in after if isinstance(e, TelemetryGap)]
    assert len(gaps) == 1 and gaps[0].rank == 0 and gaps[0].first_seq == gaps[0].last_seq
    notes = [e.message for e in after if isinstance(e, LogLine)]
    assert notes == [f"telemetry batch {gaps[0].first_seq} stands for {publisher.dropped} items dropped while "
                     "the front was not reading"]
    publisher.close()
    cable.close()


def test_close_after_a_backlog_loses_nothing(served):
    publisher = Publisher(served.rank_socket(), 0, interval_s=0.05)
    total = 4000  # two batches of at most 2000 events (under the queue's bound)
    for n in range(total):
        publisher.emit(step(n))
    publisher.close()
    got = served.events(lambda got: len(steps_of(got)) >= total, 10)
    assert steps_of(got) == list(range(total))
    assert not [e for e in got if isinstance(e, TelemetryGap)]
    assert publisher.seq == served.hub.collector.next_seq[0] - 1 == 2  # one seq per batch, none reused


def test_close_on_a_link_gone_quiet_ends_within_the_close_wait():
    """A rank whose collective timed out because its link is gone leaves in seconds, to say why in its own line
    (tests/lab/test_outage.py): its socket's queue is given CLOSE_WAIT_S, not more."""
    served = Served(JOB)
    cable = Cable(served.ports["tel"])
    publisher = Publisher(served.rank_socket(cable.port), 0, interval_s=0.05)
    for n in range(20):
        publisher.emit(step(n))
    time.sleep(0.5)
    cable.hold()
    for n in range(20, 40000):
        publisher.emit(step(n))
    time.sleep(0.5)
    with Calibrated() as cal:
        began = time.monotonic()
        publisher.close()
        took = time.monotonic() - began
    assert took < CLOSE_WAIT_S * 2 + cal.bound(2), (took, cal.factor)  # 2 s of slack times the slowdown (calibrate.py)
    cable.close()
    served.close()
