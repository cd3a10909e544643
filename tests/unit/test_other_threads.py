"""ddptop's other threads' CPU per step (issue 42): what OtherThreads reads is what the kernel counted for them.

The ground truth is the kernel's own per-thread accounting in /proc/self/task/TID/stat (utime + stime, in clock
ticks), read by each burning thread before and after it burns; OtherThreads reads the threads' CPU clocks, a
separate interface. A thread that is not ddptop's and the training thread burn too, and must not count."""

from __future__ import annotations

import os
import threading
import time

import pytest
import torch
import zmq

from ddptop.events import StepDone
from ddptop.probes.clock import CpuClock
from ddptop.probes.own import OtherThreads
from ddptop.probes.step import StepProbe

TICK_S = 1 / os.sysconf("SC_CLK_TCK")


def ticks_s(tid: int) -> float:
    """The kernel's user + system time of thread `tid`, from /proc (fields 14 and 15, in ticks)."""
    with open(f"/proc/self/task/{tid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * TICK_S


def burn(cpu_s: float, out: dict) -> None:
    """Spend `cpu_s` of this thread's CPU; `out` gets what /proc counted for it."""
    tid = threading.get_native_id()
    before = ticks_s(tid)
    start = time.thread_time()
    while time.thread_time() - start < cpu_s:
        sum(range(1000))
    out["proc_s"] = ticks_s(tid) - before


def burner(name: str, cpu_s: float, hold: threading.Event) -> tuple[threading.Thread, dict, threading.Event]:
    """A thread that burns `cpu_s`, then stays alive until `hold` is set (a thread that ended cannot be read)."""
    out: dict = {}
    burned = threading.Event()
    t = threading.Thread(target=lambda: (burn(cpu_s, out), burned.set(), hold.wait()), name=name)
    t.start()
    return t, out, burned


def test_counts_ddptop_threads_as_the_kernel_does_and_nothing_else():
    others = OtherThreads(every_s=3600)
    others.read()  # the baseline (the first step's reading)
    hold = threading.Event()
    ours = [burner("ddptop-test-a", 0.3, hold), burner("ddptop-test-b", 0.2, hold)]
    theirs = burner("not-ddptop", 0.3, hold)  # torch's or the user's thread: not ddptop's cost
    mine: dict = {}
    burn(0.2, mine)  # the training thread (the one that made the probe): own_s is its share, not this figure
    for _, _, burned in (*ours, theirs):
        burned.wait()
    spent = others.read()
    hold.set()
    for t, _, _ in (*ours, theirs):
        t.join()
    truth = sum(out["proc_s"] for _, out, _ in ours)
    assert truth >= 0.4 and theirs[1]["proc_s"] >= 0.2 and mine["proc_s"] >= 0.1  # they did burn
    assert abs(spent - truth) <= 4 * TICK_S, (spent, truth, theirs[1], mine)


def test_a_thread_read_twice_counts_its_time_once():
    others = OtherThreads(every_s=3600)
    others.read()
    go, hold, end = threading.Event(), threading.Event(), threading.Event()
    out1: dict = {}
    out2: dict = {}
    first_done = threading.Event()

    def work():
        burn(0.25, out1)
        first_done.set()
        go.wait()
        burn(0.25, out2)
        hold.set()
        end.wait()  # alive until read

    t = threading.Thread(target=work, name="ddptop-test-twice")
    t.start()
    first_done.wait()
    first = others.read()
    go.set()
    hold.wait()
    second = others.read()
    end.set()
    t.join()
    assert abs(first - out1["proc_s"]) <= 3 * TICK_S, (first, out1)
    assert abs(second - out2["proc_s"]) <= 3 * TICK_S, (second, out2)


def test_zeromq_io_threads_are_ddptops():
    ctx = zmq.Context()
    sock = ctx.socket(zmq.PUSH)
    sock.bind("tcp://127.0.0.1:*")
    try:
        zmq_tids: set = set()
        deadline = time.monotonic() + 30
        while len(zmq_tids) < 2 and time.monotonic() < deadline:  # each names itself once it runs (I/O, reaper)
            time.sleep(0.01)
            for name in os.listdir("/proc/self/task"):
                with open(f"/proc/self/task/{name}/comm") as f:
                    if f.read().startswith("ZMQbg"):
                        zmq_tids.add(int(name))
        named = set(OtherThreads().threads())
        assert zmq_tids and zmq_tids <= named
    finally:
        sock.close(0)
        ctx.term()


def test_each_step_carries_the_mean_of_the_steps_since_the_reading_before():
    """Steps resolved on a ddptop thread that burns a known CPU time between readings: each StepDone's threads_s
    is that time over the steps between the readings, as the kernel counted it."""
    events: list = []
    probe = StepProbe(0, CpuClock(), events.append, detail=False)
    probe.threads = OtherThreads(every_s=0.0)  # read at every step: each window is one step
    results: dict = {}

    def publisher():
        outs = []
        for item in list(events):
            out: dict = {}
            burn(0.05, out)
            outs.append(out["proc_s"])
            results.setdefault("done", []).extend(item.resolve())
        results["burned"] = outs

    for step in range(4):
        probe.begin()
        probe.ready(step, 0, 0)
        probe.finish(torch.tensor(0.0), 0, 2)
    probe.close()
    t = threading.Thread(target=publisher, name="ddptop-publish-test")
    t.start(), t.join()
    done = [e for e in results["done"] if isinstance(e, StepDone)]
    assert len(done) == 4
    assert done[0].threads_s == 0.0  # the first step takes the baseline: the threads' start is no step's
    for d, proc_s in zip(done[1:], results["burned"][1:]):
        assert d.threads_s == pytest.approx(proc_s, abs=3 * TICK_S), ([x.threads_s for x in done], results["burned"])
        assert d.threads_s > 0.03


def test_steps_before_the_first_reading_are_left_out_of_the_mean():
    from ddptop import metrics

    def step(i: int, threads_s: float) -> StepDone:
        return StepDone(rank=0, step=i, epoch=0, segment=0, t=float(i), iter_s=0.01, data_s=0.0, compute_s=0.0,
                        comm_s=0.0, exposed_comm_s=0.0, overlap=0.0, batch_size=2, loss=1.0, comm_bytes=0,
                        tx_bytes=0, rx_bytes=0, sampled=False, own_s=0.001, threads_s=threads_s)

    f = metrics.window([step(0, 0.0), step(1, 0.0), step(2, 0.002), step(3, 0.004)])
    assert f.threads_s == pytest.approx(0.003) and f.own_s == pytest.approx(0.001)
    assert metrics.window([step(0, 0.0)]).threads_s == 0.0  # a file from before issue 42
