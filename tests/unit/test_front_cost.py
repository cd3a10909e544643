"""The front's CPU per job step (front.cost, issue 42): CPU the kernel counted for this process, over the steps the
ranks finished, never the CPU of an interval without steps; a reading over no step is refused where decoded."""

from __future__ import annotations

import os
import threading
import time

import pytest

from ddptop.events import EventDecodeError, FrontCost, StepDone, event_from_dict
from ddptop.front.cost import EVERY_S, FrontMeter
from ddptop.metrics.cost import front_per_step

TICK = os.sysconf("SC_CLK_TCK")


def proc_cpu() -> float:
    """This process's user + system CPU from /proc/self/stat (fields 14, 15, in clock ticks): the kernel's count,
    read another way than the meter's process_time."""
    with open("/proc/self/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def burn(cpu_s: float) -> None:
    """Burn `cpu_s` of CPU on a thread of its own (the front's collector and recorder are threads too)."""
    def spin():
        end = time.thread_time() + cpu_s
        while time.thread_time() < end:
            pass
    t = threading.Thread(target=spin)
    t.start()
    t.join()


def done(step: int, rank: int = 0) -> StepDone:
    return StepDone(rank=rank, step=step, epoch=0, segment=0, t=1000.0 + step, iter_s=0.01, data_s=0.0,
                    compute_s=0.01, comm_s=0.0, exposed_comm_s=0.0, overlap=0.0, batch_size=2, loss=1.0,
                    comm_bytes=0, tx_bytes=0, rx_bytes=0, sampled=False)


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_a_reading_is_the_cpu_the_kernel_counted_over_the_steps_the_ranks_finished():
    clock = Clock()
    meter = FrontMeter(clock=clock)
    assert meter([done(0), done(0, rank=1)]) == []  # the first step: start-up, not counted
    clock.now += EVERY_S
    assert meter([]) == []  # the first reading is the baseline
    before = proc_cpu()
    burn(0.6)
    after = proc_cpu()
    clock.now += EVERY_S
    out = meter([done(s, rank=r) for s in range(1, 41) for r in (0, 1)])  # 40 job steps, two ranks each
    assert len(out) == 1 and isinstance(out[0], FrontCost)
    reading = out[0]
    assert reading.steps == 40 and reading.step == 40
    # the kernel's count, read by /proc: ticks of 10 ms, and the meter's own reads fall just outside the window
    assert abs(reading.cpu_s - (after - before)) <= 3 / TICK + 0.02, (reading.cpu_s, after - before)
    assert reading.cpu_s >= 0.6
    assert front_per_step([reading])[0] == pytest.approx(reading.cpu_s / 40)


def test_no_reading_before_its_period_and_cpu_without_steps_belongs_to_no_step():
    clock = Clock()
    meter = FrontMeter(clock=clock)
    meter([done(0)])
    clock.now += EVERY_S
    meter([])
    clock.now += EVERY_S / 2
    assert meter([done(1)]) == []  # not yet: a rate every EVERY_S, never per step
    clock.now += EVERY_S
    assert len(meter([done(2)])) == 1
    burn(0.5)  # paused: no step finishes while the front spends CPU
    clock.now += EVERY_S
    assert meter([]) == []
    clock.now += EVERY_S
    out = meter([done(3)])
    assert len(out) == 1 and out[0].steps == 1
    assert out[0].cpu_s < 0.25, out  # the pause's 0.5 s went with the baseline, not onto step 3


def test_the_figure_weighs_readings_by_their_steps_and_a_stepless_reading_is_refused():
    a = FrontCost(cpu_s=0.10, steps=100, step=100, t=1.0)
    b = FrontCost(cpu_s=0.30, steps=50, step=150, t=3.0)
    assert front_per_step([a, b]) == (pytest.approx(0.4 / 150), 150)
    assert front_per_step([]) == (0.0, 0)
    wire = b.to_dict()
    assert event_from_dict(wire) == b
    for bad in ({"steps": 0}, {"steps": -3}, {"cpu_s": -1.0}, {"cpu_s": float("nan")}, {"cpu_s": "1"}):
        with pytest.raises(EventDecodeError):
            event_from_dict({**wire, **bad})


def test_the_header_shows_the_fronts_cpu_per_step_over_its_last_readings():
    from ddptop.state.session import FRONT_READINGS, SessionState
    from ddptop.tui.render.units import fmt_s
    from ddptop.tui.widgets.header import own_cost

    state = SessionState()
    for s in range(30):
        state.apply(StepDone(rank=0, step=s, epoch=0, segment=0, t=1000.0 + s, iter_s=0.01, data_s=0.0,
                             compute_s=0.01, comm_s=0.0, exposed_comm_s=0.0, overlap=0.0, batch_size=2, loss=1.0,
                             comm_bytes=0, tx_bytes=0, rx_bytes=0, sampled=False, own_s=0.0005, threads_s=0.0002))
    assert "front" not in own_cost(state.snapshot())  # no reading yet: nothing said, never a zero
    readings = [FrontCost(cpu_s=0.5, steps=10, step=10, t=1.0)]  # an old, dear reading that has left the window
    readings += [FrontCost(cpu_s=0.001 * (i + 1), steps=4, step=10 + 4 * (i + 1), t=2.0 + i)
                 for i in range(FRONT_READINGS)]
    state.apply_all(readings)
    recent = readings[-FRONT_READINGS:]
    want = sum(r.cpu_s for r in recent) / sum(r.steps for r in recent)
    text = own_cost(state.snapshot())
    assert text.endswith(f" +{fmt_s(want)} front"), text
    assert "CPU on its threads" in text


def test_the_header_shortens_ddptops_cost_before_it_cuts_the_recordings_name():
    """At 160 columns with long figures the first line once ended "rec ● runs/20261128-130315-ddp.…" (an e2e run
    under load): the name of the file being written is what a user needs from that line. The cost gives way: its
    words first, then the figures after the share, then all of it; the name stays whole."""
    from ddptop.state.session import SessionState
    from ddptop.tui.widgets.header import StatusHeader

    state = SessionState()
    for s in range(30):
        state.apply(StepDone(rank=0, step=s, epoch=0, segment=0, t=1000.0 + s, iter_s=0.08, data_s=0.0,
                             compute_s=0.08, comm_s=0.0, exposed_comm_s=0.0, overlap=0.0, batch_size=16, loss=1.0,
                             comm_bytes=0, tx_bytes=0, rx_bytes=0, sampled=False, own_s=0.0037, threads_s=0.0010))
    state.apply_all([FrontCost(cpu_s=0.04, steps=10, step=10 + 10 * i, t=2.0 + i) for i in range(3)])
    snap = state.snapshot()
    name = "runs/20261128-130315-ddp.db"
    header = StatusHeader("live", name, 100000)
    whole = header._first_line(snap, True).plain
    assert "of a step" in whole and "CPU on its threads" in whole and whole.endswith(f"rec ● {name}"), whole
    seen = set()
    for width in range(len(whole) + 5, 60, -1):
        line = header._first_line(snap, True, width).plain
        assert line.endswith(f" · rec ● {name}"), (width, line)
        if len(whole) <= width:
            assert line == whole, width
        cost = line.split(" · ddptop ")[1].split(" · rec ")[0] if " · ddptop " in line else ""
        assert len(line) <= width or not cost, (width, line)  # only when nothing but the name is left to cut
        seen.add(("of a step" in cost, "threads" in cost, "front" in cost, bool(cost)))
    # each wording appears as the line narrows: the whole, the short one (figures kept), the share alone, none
    assert {(True, True, True, True), (False, True, True, True), (False, False, False, True),
            (False, False, False, False)} <= seen, seen
