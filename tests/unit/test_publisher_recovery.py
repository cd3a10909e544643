"""The telemetry publisher against the job's real channel that goes away and comes back, and closing under load.

The channel is served as a job serves it; the outage is a real TCP link cut between the rank and the channel
(every connection reset, new ones refused), so the server keeps what it holds, as when a network blips.
"""

from __future__ import annotations

import socket
import struct
import threading
import time

import pytest

from calibrate import Calibrated

from ddptop.control.bus import CLOSE_WAIT_S, Collector, Publisher
from ddptop.control.channel import ChannelClient
from ddptop.events import LogLine, StepDone, TelemetryGap
from jobchannel import Served, job_keys
import ports

JOB = job_keys("publisher-recovery-token", "cd" * 16)


@pytest.fixture()
def served():
    job = Served(JOB)
    yield job.channel.port
    job.close()


def view(port: int, timeout_s: float = 10):
    """A rank's client of the channel at `port` (the channel's, or the relay's in front of it)."""
    return ChannelClient("127.0.0.1", port, JOB.ranks, b"ranks", timeout_s)


def step(n: int) -> StepDone:
    return StepDone(0, n, 0, 0, time.time(), 0.1, 0.0, 0.05, 0.01, 0.0, 0.0, 16, 2.3, 0, 0, 0, False)


class Cable:
    """A TCP link to the real store that the test cuts (connections reset, new ones refused) and mends."""

    def __init__(self, target: int):
        self.target, self.port = target, ports.port()
        self._open: list[socket.socket] = []
        self._lock = threading.Lock()
        self._accepting: threading.Thread | None = None
        self.frozen = threading.Event()  # set: bytes are read and dropped, nothing answers (a link gone quiet)
        self.mend()

    def mend(self) -> None:
        listener = socket.create_server(("127.0.0.1", self.port))
        listener.settimeout(0.05)
        self._up = True
        self._accepting = threading.Thread(target=self._accept, args=(listener,), daemon=True)
        self._accepting.start()

    def cut(self) -> None:
        self._up = False
        self._accepting.join()
        with self._lock:
            pairs, self._open = self._open, []
        for sock in pairs:  # a reset, not a close: the rank's next write fails instead of vanishing in a pipe
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            try:
                sock.shutdown(socket.SHUT_RDWR)  # wakes the pump blocked in recv, which holds the socket open
            except OSError:
                pass
            sock.close()
        time.sleep(0.1)

    def _accept(self, listener: socket.socket) -> None:
        with listener:
            while self._up:
                try:
                    near, _ = listener.accept()
                except socket.timeout:
                    continue
                far = socket.create_connection(("127.0.0.1", self.target))
                with self._lock:
                    self._open += [near, far]
                for a, b in ((near, far), (far, near)):
                    threading.Thread(target=_pump, args=(a, b, self.frozen), daemon=True).start()


def _pump(src: socket.socket, dst: socket.socket, frozen: threading.Event) -> None:
    try:
        while data := src.recv(65536):
            if not frozen.is_set():
                dst.sendall(data)
    except OSError:
        pass
    for sock in (src, dst):
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


def _poll_until(collector: Collector, done, timeout_s: float = 20) -> list:
    got: list = []
    deadline = time.monotonic() + timeout_s
    while not done(got) and time.monotonic() < deadline:
        got += collector.poll()
        time.sleep(0.05)
    return got


def test_telemetry_resumes_after_the_store_comes_back_and_the_loss_is_a_gap(served):
    cable = Cable(served)

    def connect():  # the worker's shape: a new client each time, giving up quickly while the link is down
        return view(cable.port, timeout_s=1)

    publisher = Publisher(connect(), 0, JOB, interval_s=0.05, connect=connect, max_queue=50)
    collector = Collector(view(served), 1, JOB)  # beside the server, as the front is
    for n in range(20):
        publisher.emit(step(n))
    steps = lambda got: [e.step for e in got if isinstance(e, StepDone)]  # noqa: E731
    before = _poll_until(collector, lambda got: len(steps(got)) == 20)
    assert steps(before) == list(range(20))

    cable.cut()
    publisher.emit(step(20))  # the write that fails
    time.sleep(0.5)
    for n in range(21, 500):  # the rank trains on during the outage: the queue keeps the newest 50
        publisher.emit(step(n))
        assert publisher.queued <= 50 + 1  # + one step being resolved
    time.sleep(0.5)
    assert publisher.queued <= 51 and publisher.dropped >= 400

    cable.mend()
    for n in range(500, 510):
        publisher.emit(step(n))
    after = _poll_until(collector, lambda got: 509 in steps(got))
    got = steps(after)
    assert got[-10:] == list(range(500, 510)), "telemetry resumed"
    assert got == sorted(set(got)) and len(got) + publisher.dropped == 490, "each step once, or counted as dropped"
    gaps = [e for e in after if isinstance(e, TelemetryGap)]
    assert len(gaps) == 1 and gaps[0].rank == 0 and gaps[0].first_seq == gaps[0].last_seq
    notes = [e.message for e in after if isinstance(e, LogLine)]
    assert notes == [f"telemetry batch {gaps[0].first_seq} stands for {publisher.dropped} items dropped while "
                     "the store was unreachable or slow"]
    publisher.close()
    cable.cut()


class Gate:
    """A real store whose batch writes wait at a gate: the publisher's thread held mid-flush (a slow link)."""

    def __init__(self, store):
        self.store = store
        self.opened = threading.Event()
        self.waiting = 0
        self._lock = threading.Lock()

    def multi_set(self, names, values):
        with self._lock:
            self.waiting += 1
        self.opened.wait()
        return self.store.multi_set(names, values)

    def __getattr__(self, name):
        return getattr(self.store, name)


def test_close_while_the_thread_flushes_a_backlog_loses_nothing(served):
    gate = Gate(view(served))
    publisher = Publisher(gate, 0, JOB, interval_s=0.05)
    total = 4000  # two batches of at most 2000 events (under the queue's bound)
    for n in range(total):
        publisher.emit(step(n))
    deadline = time.monotonic() + 10
    while not gate.waiting and time.monotonic() < deadline:  # the thread is writing batch 1
        time.sleep(0.01)
    closing = threading.Thread(target=publisher.close)
    closing.start()
    # a second writer at once would be two batches under one seq; close waits for a thread that makes no progress
    # CLOSE_WAIT_S (then cuts a write that hangs on a dead link): the gate stays shut for most of that
    deadline = time.monotonic() + CLOSE_WAIT_S * 0.75
    while gate.waiting < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    gate.opened.set()
    closing.join(timeout=30)
    assert not closing.is_alive()
    collector = Collector(view(served), 1, JOB)
    got = _poll_until(collector, lambda got: len([e for e in got if isinstance(e, StepDone)]) >= total, 10)
    assert [e.step for e in got if isinstance(e, StepDone)] == list(range(total))
    assert not [e for e in got if isinstance(e, TelemetryGap)]
    assert publisher.seq == collector.next_seq[0] - 1 == 2  # one seq per batch, none reused


def test_close_on_a_link_gone_quiet_ends_within_the_close_wait_not_the_clients_timeout(served):
    """A rank whose collective timed out because its link is gone leaves in seconds, to say why in its own line
    (tests/lab/test_outage.py): every channel call waits for an answer that will not come (here: 30 s)."""
    cable = Cable(served)
    publisher = Publisher(view(cable.port, timeout_s=30), 0, JOB, interval_s=0.05)
    for n in range(20):
        publisher.emit(step(n))
    time.sleep(0.5)
    cable.frozen.set()
    for n in range(20, 40):
        publisher.emit(step(n))
    time.sleep(0.5)  # the thread's write of steps 20-39 now waits on the frozen link
    with Calibrated() as cal:
        began = time.monotonic()
        publisher.close()
        took = time.monotonic() - began
    # before the fix: 30 s (the client's timeout), then the last flush's 30 s; 2 s of slack times the machine's
    # slowdown (calibrate.py)
    assert took < CLOSE_WAIT_S + cal.bound(2), (took, cal.factor)
    cable.cut()
