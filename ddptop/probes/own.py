"""ddptop's own cost: the training thread's seconds in ddptop code per step phase, and its other threads' CPU."""

from __future__ import annotations

import os
import threading
import time

now = time.perf_counter


class OwnTime:
    """Code that runs on the training path (marks, hooks, comm bookkeeping, the boundary exchange) adds the
    seconds it took; the step probe takes the total at every phase mark.

    `add` may run on another thread (a backend's completion thread, CUDA's autograd thread): list.append is
    atomic under the GIL, so nothing is lost and no lock is taken on the hot path."""

    __slots__ = ("_spent",)

    def __init__(self) -> None:
        self._spent: list[float] = []

    def add(self, seconds: float) -> None:
        self._spent.append(seconds)

    def since(self, start: float) -> None:
        """Add the time since `start` (a perf_counter value)."""
        self._spent.append(now() - start)

    def take(self) -> float:
        spent, self._spent = self._spent, []
        return sum(spent)


THREAD_PREFIX = "ddptop-"  # every thread ddptop starts is named so (publisher, sampler, control)
ZMQ_PREFIX = "ZMQbg"  # ZeroMQ's own I/O and reaper threads: ddptop's sockets' cost, started by no Python code


def thread_cpu_s(tid: int) -> float:
    """CPU seconds (user + system) the kernel counted for thread `tid` of this process, to the nanosecond.

    Linux encodes a thread's CPU clock as ((~tid) << 3) | 6 (CPUCLOCK_SCHED | CPUCLOCK_PERTHREAD, as
    pthread_getcpuclockid returns it), readable for any thread of the calling process; a thread gone raises OSError.
    /proc/self/task/TID/stat holds the same count in 10 ms ticks, too coarse to read four times a second."""
    return time.clock_gettime(((~tid) << 3) | 6)


class OtherThreads:
    """The CPU time ddptop's threads other than the training thread spend per training step on this rank: read
    from the kernel per thread, at most every `every_s` (the publisher calls `step()` as it resolves each step, and
    a reading lists the threads and reads their clocks: ~50 µs, never per step). Each step carries the newest
    reading's mean over the steps since the one before it. The first step resolved takes the first reading, so the
    threads' start (imports, the sockets' CURVE handshakes: 50 ms) is no step's; the steps until the second reading
    carry 0, "not measured" (metrics leaves them out of the mean).

    The threads: Python threads named ddptop-* and ZeroMQ's I/O threads, never the training thread (`own_s` is
    its share), torch's threads, nor the data loader's. A thread that ends between two readings takes its last
    interval's time with it (a sampler stopped at a segment's end: a few ms)."""

    def __init__(self, training_tid: int | None = None, every_s: float = 1.0):
        self.training_tid = threading.get_native_id() if training_tid is None else training_tid
        self.every_s = every_s
        self.per_step_s = 0.0
        self._steps = 0
        self._last: dict[int, float] = {}
        self._zmq: set[int] = set()  # ZeroMQ's threads seen, alive at the last listing
        self._next = 0.0  # the first step() reads

    def step(self) -> float:
        """One more step resolved; its share of the other threads' CPU time (the newest reading's mean)."""
        if not self._next:
            self.read()
            return 0.0
        self._steps += 1
        if time.monotonic() >= self._next:
            spent = self.read()
            self.per_step_s = spent / self._steps
            self._steps = 0
        return self.per_step_s

    def read(self) -> float:
        """CPU seconds the threads spent since the last reading (a new thread: all of its time)."""
        self._next = time.monotonic() + self.every_s
        now_s: dict[int, float] = {}
        for tid in self.threads():
            try:
                now_s[tid] = thread_cpu_s(tid)
            except OSError:  # ended since it was listed
                continue
        spent = sum(max(0.0, s - self._last.get(tid, 0.0)) for tid, s in now_s.items())
        self._last = now_s
        return spent

    def threads(self) -> list[int]:
        tids = [t.native_id for t in threading.enumerate()
                if t.name.startswith(THREAD_PREFIX) and t.native_id not in (None, self.training_tid)]
        try:
            tasks = os.listdir("/proc/self/task")
        except OSError:  # no /proc (not Linux): the Python threads only
            return tids
        self._zmq &= {int(name) for name in tasks}  # a thread id may be reused once its thread ended
        for name in tasks:
            tid = int(name)
            if tid in self._zmq or (tid != self.training_tid and _comm(tid).startswith(ZMQ_PREFIX)):
                self._zmq.add(tid)  # a new thread names itself after it starts: only a ZeroMQ name is kept
                tids.append(tid)
        return tids


def _comm(tid: int) -> str:
    try:
        with open(f"/proc/self/task/{tid}/comm") as f:
            return f.read()
    except OSError:
        return ""
