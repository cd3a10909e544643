"""The step probe never makes the training thread wait for the device: marks and the loss are read on the
publisher's thread, after waiting for them there; the device is synchronized once, at the run's end.

A fake device clock stands in for CUDA events (no GPU here): its marks can be read only after a wait that covers
them, like `elapsed_time` on an event that has not completed ("device not ready"); marks on a side stream (a DDP
bucket's completion) are covered only by a wait on themselves."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from ddptop.config import RunConfig, SyncConfig
from ddptop.events import StepDone
from ddptop.probes.clock import CpuClock
from ddptop.probes.step import StepProbe, net_seconds
from ddptop.train.loop import Trainer


class NotReady(RuntimeError):
    pass


class Mark:
    def __init__(self, clock: "FakeDeviceClock", seq: int, t: float, side: bool):
        self.clock, self.seq, self.t, self.side = clock, seq, t, side

    @property
    def done(self) -> bool:
        c = self.clock
        return c.synchronized or (self in c.waited if self.side else self.seq <= c.completed)


class Held:
    """The loss as the device would leave it in host memory: readable once a later mark completed."""

    def __init__(self, clock: "FakeDeviceClock", seq: int, value: float):
        self.clock, self.seq, self.value = clock, seq, value

    def __float__(self) -> float:
        self.clock.calls.append(("read", threading.current_thread().name))
        if not (self.clock.synchronized or self.seq < self.clock.completed):
            raise NotReady("the loss was read before the step's end mark completed")
        return self.value


class FakeDeviceClock:
    def __init__(self):
        self.seq, self.completed, self.synchronized = 0, 0, False
        self.waited: set = set()
        self.calls: list[tuple[str, str]] = []  # (what, thread name)

    def now(self, side: bool = False) -> Mark:
        self.seq += 1
        return Mark(self, self.seq, self.seq * 0.01, side)

    def ready(self, mark: Mark) -> bool:
        return mark.done

    def wait(self, mark: Mark) -> None:
        self.calls.append(("wait", threading.current_thread().name))
        if mark.side:
            self.waited.add(mark)
        else:
            self.completed = max(self.completed, mark.seq)

    def seconds(self, start: Mark, end: Mark) -> float:
        if not (start.done and end.done):
            raise NotReady("elapsed_time on a mark that has not completed")
        return end.t - start.t

    def hold(self, tensor) -> Held:
        self.seq += 1
        return Held(self, self.seq, float(tensor.detach()))  # the test's tensor is on the CPU: read it to fake one

    def synchronize(self) -> None:
        self.calls.append(("synchronize", threading.current_thread().name))
        self.synchronized = True


def _resolve_on_another_thread(records) -> list:
    out: list = []
    worker = threading.Thread(target=lambda: out.extend(e for r in records for e in r.resolve()), name="publisher")
    worker.start()
    worker.join()
    return out


def _run_steps(probe: StepProbe, clock: FakeDeviceClock, losses: list[float]) -> None:
    for step, value in enumerate(losses):
        probe.begin()
        probe.ready(step, 0, 0)
        for phase in ("data", "fwd"):
            probe.mark(phase)
        start = probe.comm.now()
        probe.comm.add("bucket 0", start, clock.now(side=True), 400, 600, 600)  # completes on another stream
        for phase in ("bwd", "sync", "opt"):
            probe.mark(phase)
        probe.finish(torch.tensor(value), epoch=0, batch_size=8)


def test_the_training_thread_never_waits_and_the_publisher_reads_only_completed_marks():
    clock, records = FakeDeviceClock(), []
    probe = StepProbe(0, clock, records.append, span_every=1000)
    _run_steps(probe, clock, [2.5, 2.25, 2.0])
    assert clock.calls == [] and len(records) == 2  # the third step ends at the next boundary, or at close()
    early = _resolve_on_another_thread(records)  # the steps whose end mark exists, while the device is "busy"
    assert [e.loss for e in early if isinstance(e, StepDone)] == [2.5, 2.25]
    assert {thread for _, thread in clock.calls} == {"publisher"}
    assert not clock.synchronized
    probe.close()
    assert clock.calls.count(("synchronize", threading.current_thread().name)) == 1  # once per run, at the end
    last = _resolve_on_another_thread(records[2:])
    done = [e for e in last if isinstance(e, StepDone)]
    assert [d.loss for d in done] == [2.0] and done[0].comm_s > 0
    reads = [thread for what, thread in clock.calls if what in ("read", "wait")]
    assert set(reads) == {"publisher"}


def test_completed_marks_are_read_without_a_wait():
    """A step whose marks have all completed is resolved without one `wait` (on CUDA each is a GIL hand-over)."""
    clock, records = FakeDeviceClock(), []
    probe = StepProbe(0, clock, records.append, span_every=1000)
    _run_steps(probe, clock, [2.5, 2.25, 2.0])
    probe.close()  # the device is idle: every mark, the side-stream ones too, has completed
    done = [e for e in _resolve_on_another_thread(records) if isinstance(e, StepDone)]
    assert [d.loss for d in done] == [2.5, 2.25, 2.0] and all(d.comm_s > 0 for d in done)
    assert [what for what, _ in clock.calls if what == "wait"] == []


def test_without_waiting_the_marks_could_not_be_read():
    """The fake is strict: a record resolved without its waits fails, so the test above can fail."""
    clock, records = FakeDeviceClock(), []
    probe = StepProbe(0, clock, records.append, span_every=1000)
    _run_steps(probe, clock, [1.0, 1.0])
    clock.wait = lambda mark: None
    with pytest.raises(NotReady):
        records[0].resolve()


@pytest.mark.parametrize("detail", [True, False])
def test_every_probes_level_reads_the_loss_off_the_training_thread(detail):
    clock, records = FakeDeviceClock(), []
    probe = StepProbe(0, clock, records.append, detail=detail)
    _run_steps(probe, clock, [3.0, 1.5])
    probe.close()
    assert [c for c in clock.calls if c[0] != "synchronize"] == []
    done = [e for e in _resolve_on_another_thread(records) if isinstance(e, StepDone)]
    assert [d.loss for d in done] == [3.0, 1.5]


def test_the_held_loss_is_a_copy_a_later_step_cannot_overwrite():
    records: list = []
    probe = StepProbe(0, CpuClock(), records.append, span_every=1000)
    loss = torch.tensor(4.0)
    probe.begin()
    probe.ready(0, 0, 0)
    for phase in ("data", "fwd", "bwd", "sync", "opt"):
        probe.mark(phase)
    probe.finish(loss, epoch=0, batch_size=8)
    loss.fill_(-1.0)  # the storage is reused before the publisher gets to the step
    probe.close()
    (done,) = [e for e in records[0].resolve() if isinstance(e, StepDone)]
    assert done.loss == 4.0


class CountingClock(CpuClock):
    """The CPU clock, recording the thread that reads a held loss."""

    def __init__(self):
        self.reads: list[str] = []
        self.synchronized: list[str] = []

    def hold(self, tensor):
        clock, value = self, super().hold(tensor)

        class Read:
            def __float__(self):
                clock.reads.append(threading.current_thread().name)
                return float(value)

        return Read()

    def synchronize(self) -> None:
        self.synchronized.append(threading.current_thread().name)


def test_a_real_training_loop_reads_no_loss_on_its_thread(monkeypatch):
    """Trainer.run at --probes off and all: no host read of a floating-point tensor (the loss: `.item()` syncs on
    CUDA) on the training thread. (The DataLoader draws its int64 seed with `.item()` once per epoch, on the CPU.)"""
    main = threading.current_thread().name
    touched: list[str] = []
    for name in ("item", "tolist", "__float__"):
        original = getattr(torch.Tensor, name)

        def spy(self, *args, _original=original, _name=name):
            if self.is_floating_point():
                touched.append(f"{_name} on {threading.current_thread().name}")
            return _original(self, *args)

        monkeypatch.setattr(torch.Tensor, name, spy)
    for detail in (False, True):
        clock, records = CountingClock(), []
        cfg = RunConfig(model="tiny", sync=SyncConfig(strategy="single", batch_size=16), steps=5, synthetic_size=160,
                        eval=False, backend="gloo")
        probe = StepProbe(0, clock, records.append, span_every=2, detail=detail)
        touched.clear()
        Trainer(cfg, 0, 1, torch.device("cpu"), records.append, probe).run()
        assert [t for t in touched if t.endswith(main)] == [] and clock.synchronized == [main]
        steps = [e for e in _resolve_on_another_thread([r for r in records if hasattr(r, "resolve")])
                 if isinstance(e, StepDone)]
        assert [d.step for d in steps] == [0, 1, 2, 3, 4] and clock.reads == ["publisher"] * 5
        assert all(0 < d.loss < 10 for d in steps)


@pytest.mark.parametrize("clock_s, host_s, removed_s, expected", [
    (10.05, 10.0, 9.99, 0.01005),  # a 10 s phase, 9.99 s of it a pause: 0.1% of the device's 10.05 s
    (0.050, 0.002, 0.001, 0.025),  # half the host's phase was ddptop's: half the device's phase is taken out
    (0.3, 0.3, 0.1, 0.2),  # CPU: one clock, a plain difference
    (0.05, 0.0, 0.0, 0.05),  # nothing of the host's to take out
    (0.05, 0.01, 0.02, 0.0),  # never negative
])
def test_host_seconds_are_taken_out_within_the_host_clock(clock_s, host_s, removed_s, expected):
    """Set-aside and ddptop time are host seconds: they leave the host's share of a phase, never a device
    duration directly (10.05 s of CUDA time less 9.99 s of host pause would keep 60 ms for 10 ms of work)."""
    assert net_seconds(clock_s, host_s, removed_s) == pytest.approx(expected)


SWITCH_S = 0.003  # a thread switch as the clock is read (another thread held the GIL: up to its 5 ms interval)
WORK_S = 0.004  # the step's own work in each phase the test times itself


class SwitchedOutClock(CpuClock):
    """The CPU clock, read SWITCH_S late: the training thread is switched out as it calls for a reading."""

    def now(self) -> float:
        time.sleep(SWITCH_S)
        return super().now()


class SlowRemoval:
    """A hook handle whose removal takes SWITCH_S, as a thread switch inside the layer probe's detach would."""

    def remove(self) -> None:
        time.sleep(SWITCH_S)


@pytest.mark.alone  # the step's clock against the test's own, within one thread switch (SWITCH_S): a neighbour on
# the other core stretched a switch to 6 ms in a -n 2 CI run
def test_ddptops_own_time_is_counted_once_inside_its_phase():
    """A part may never exceed the step it belongs to. A mark's cost before its reading was charged to the next
    phase's own time while it also stayed in the phase the mark ends (bwd, opt, the previous step's tail), and the
    layer probe's detach was counted by itself and again by `finish` around it: a thread switch at either place put
    the parts over the step (tests/ranks/test_probes.py under load: 3 of 960 gather-scatter steps, 110 µs-3 ms over;
    0 of 800 after). Ground truth: the test's own clock around each step, and the sleeps it does in each phase."""
    model, records, outer = torch.nn.Sequential(torch.nn.Linear(32, 10)), [], []  # one layer: 4 hook readings
    probe = StepProbe(0, SwitchedOutClock(), records.append, span_every=1)
    probe.watch(model, overlapped_backward=False)
    inputs, labels = torch.randn(8, 32), torch.randint(0, 10, (8,))
    for step in range(3):  # steps 1 and 2 are sampled: layer hooks attached and detached
        began = time.perf_counter()
        probe.begin()
        probe.ready(step, 0, 0)
        time.sleep(WORK_S)
        probe.mark("data")
        if probe.layers._handles:
            probe.layers._handles.append(SlowRemoval())
        loss = torch.nn.functional.cross_entropy(model(inputs), labels)
        probe.mark("fwd")
        loss.backward()
        probe.mark("bwd")
        start = time.perf_counter()  # the CPU clock's marks are perf_counter values: this span is read on time
        time.sleep(WORK_S)  # a collective the rank waits for: exposed communication
        probe.comm.add("gather w", start, time.perf_counter(), 4, 4, 4)
        probe.mark("sync")
        time.sleep(WORK_S)
        probe.mark("opt")
        probe.finish(loss, epoch=0, batch_size=8)
        outer.append(time.perf_counter() - began)
    probe.close()
    done = [e for r in records for e in r.resolve() if isinstance(e, StepDone)]
    assert [d.step for d in done] == [0, 1, 2]
    for d, outside in zip(done, outer):
        measured = d.data_s + d.fwd_s + d.bwd_s + d.opt_s + d.exposed_comm_s + d.own_s
        assert measured <= d.iter_s + 2e-5, (d.step, measured - d.iter_s)
        assert d.iter_s <= outside + SWITCH_S  # the step's end mark was read after this step's clock stopped
        assert d.data_s >= WORK_S and d.opt_s >= WORK_S and d.exposed_comm_s >= WORK_S


def test_the_layers_are_listed_once_per_build_not_on_every_sampled_step(monkeypatch):
    """The layer probe hooks every leaf layer on each sampled step; the list of leaves is the model's, known when the
    strategy is built. Walking the module tree again on every sampled step cost time inside the step (VGG-11: 30
    modules; ResNet-50: 150). Real training loops of 3 and 9 steps, every step after the first sampled: the walks of
    the model (named_modules, counted as torch is asked) are as many for 9 steps as for 3, and the layer spans are
    there on every sampled step."""
    walks: list[int] = []
    original = torch.nn.Module.named_modules

    def counted(self, *args, **kwargs):
        walks.append(1)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(torch.nn.Module, "named_modules", counted)
    seen = {}
    for steps in (3, 9):
        records = []
        cfg = RunConfig(model="tiny", sync=SyncConfig(strategy="single", batch_size=16), steps=steps,
                        synthetic_size=16 * steps, eval=False, backend="gloo")
        probe = StepProbe(0, CpuClock(), records.append, span_every=1)
        walks.clear()
        Trainer(cfg, 0, 1, torch.device("cpu"), records.append, probe).run()
        events = _resolve_on_another_thread([r for r in records if hasattr(r, "resolve")])
        sampled = [e.step for e in events if isinstance(e, StepDone) and e.sampled]
        layered = {e.step for e in events if hasattr(e, "spans") and any(s.kind == "fwd" for s in e.spans)}
        assert sampled == list(range(1, steps)) and layered == set(sampled), (sampled, layered)
        seen[steps] = len(walks)
    assert seen[9] == seen[3], f"named_modules calls: {seen} (more sampled steps, more walks of the model)"
