"""Per-step measurement: a step runs from one step boundary to the next; marks, comm and layer spans in,
StepDone and StepSpans out (built on the publisher's thread, not the training thread).

A step's phases, in order, each ending at its mark:
  ready  the step boundary: the control exchange (ddptop), a switch or a pause (set aside, not step time)
  data   the next batch, copied to the device (an end-of-epoch test is set aside)
  fwd    forward and loss      bwd  backward (DDP: its buckets go out meanwhile)
         with accum K > 1 `data` is the first batch's and `fwd`, `bwd` the last (synchronized) micro-step's;
         the K−1 before it (each one's forward, backward, then the next batch's loading) run between `data`
         and `fwd`, are marked apart (`micro`: the spans show each one) and make `micro_s`, carved out of
         the forward's interval at the last of those marks (compute, with no sync)
  sync   the strategy's collectives      opt  the optimizer step
  tail   until the next boundary: handing the step's record to the publisher (ddptop)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from ddptop.events import Event, Span, StepDone, StepSpans
from ddptop.probes.clock import CpuClock, wall_clock
from ddptop.probes.comm import CommMark, CommRecorder, NullRecorder
from ddptop.probes.layers import LayerProbe
from ddptop.probes.own import OtherThreads, OwnTime, now
from ddptop.metrics.timeline import breakdown
from ddptop.testhooks import rank_hooks

PHASES = ("ready", "data", "fwd", "bwd", "sync", "opt", "tail")


@dataclass
class _Step:
    """One step's raw marks; resolved into events later (CUDA marks may still be in flight)."""

    t0: Any
    wall_t0: float
    host_t0: float  # perf_counter at t0: set-aside and own seconds are host seconds (see net_seconds)
    step: int = -1
    segment: int = 0
    epoch: int = 0
    batch_size: int = 0
    tokens: int = 0
    sampled: bool = False
    overlapped_backward: bool = False  # the step's own segment's (a switch may come before it is resolved)
    marks: dict[str, Any] = field(default_factory=dict)
    host: dict[str, float] = field(default_factory=dict)  # perf_counter at each mark
    aside: dict[str, float] = field(default_factory=dict)  # seconds set aside (pause, switch, test) per phase
    own: dict[str, float] = field(default_factory=dict)  # ddptop's own seconds per phase
    comm: list[CommMark] = field(default_factory=list)
    micro: list = field(default_factory=list)  # (phase, mark) of the unsynchronized micro-steps, in order
    micro_end: Any = None  # the last of them: the synchronized micro-step's batch is in (accum > 1 only)
    layers: list = field(default_factory=list)
    loss: Any = None
    end: Any = None
    host_end: float = 0.0
    wall_end: float = 0.0
    finished: bool = False

    def phase(self) -> str:
        """The phase running now: the first one not marked yet."""
        return PHASES[min(len(self.marks), len(PHASES) - 1)]


class StepProbe:
    """Owns a rank's clock, comm recorder and layer hooks. `emit` receives one resolvable record per step.

    `detail=False` (`--probes off|system`) keeps only the boundary marks: step time, ddptop's cost, loss.
    """

    def __init__(self, rank: int, clock: Any, emit: Callable[[Any], None], span_every: int = 10,
                 spans: bool = True, detail: bool = True, comm: CommRecorder | None = None):
        self.rank = rank
        self.clock = clock
        self.emit = emit
        self.span_every = span_every
        self.detail = detail
        self.spans = spans and detail
        self.own = comm.own if comm is not None else OwnTime()
        self.comm = comm if comm is not None else (CommRecorder(clock, self.own) if detail else NullRecorder())
        self.hooks = hooks = rank_hooks(rank)
        self.comm.delay_s = hooks.delay_s if not hooks.delay_from else 0.0
        self.wall = wall_clock(hooks.clock_offset_s)  # stamps steps (t), spans (t0) and answers the clock ping-pong
        self.layers: LayerProbe | None = None
        self.overlapped_backward = False  # DDP: buckets go out during backward, which waits for the last ones
        self._cur: _Step | None = None
        self.sampled = False
        self._host_clock = isinstance(clock, CpuClock)  # its marks are perf_counter values already
        self.threads = OtherThreads()  # made on the training thread: that one is own_s's, not counted here

    def _host(self, mark: Any) -> float:
        """perf_counter at `mark`: the mark itself on CPU, else a host reading taken beside it."""
        return mark if self._host_clock else now()

    def watch(self, model, overlapped_backward: bool) -> None:
        """Called when a configuration segment starts, with the plain (unwrapped) model."""
        self.layers = LayerProbe(model, self.clock, self.own) if self.spans else None
        self.overlapped_backward = overlapped_backward

    # -- the training thread ------------------------------------------------------------------------------
    def begin(self) -> None:
        """A step boundary: the previous step ends here and the next one starts."""
        began = now()
        mark = self.clock.now()
        host = self._host(mark)
        self.own.add(host - began)  # before the reading: the previous step's tail (see `mark`)
        self._close(mark, host)
        self.comm.take()  # drop anything left from an aborted step
        self._cur = _Step(t0=mark, wall_t0=self.wall(), host_t0=host)
        self.own.since(host)

    def aside(self, seconds: float) -> None:
        """Time inside the step's interval that belongs to no step (a pause, a switch, a test pass)."""
        cur = self._cur
        if cur is not None and seconds > 0:
            phase = cur.phase()
            cur.aside[phase] = cur.aside.get(phase, 0.0) + seconds

    def ready(self, step: int, segment: int, segment_start: int) -> None:
        """The boundary's work is done; `step` runs under `segment`, which began at `segment_start`.

        A segment's first step is never sampled (DDP's first iteration has one bucket for everything)."""
        cur = self._cur
        if self.hooks.delay_from:  # the test hook's straggle from a given step on (testhooks.rank_hooks)
            self.comm.delay_s = self.hooks.delay_s if step >= self.hooks.delay_from else 0.0
        cur.step, cur.segment, cur.overlapped_backward = step, segment, self.overlapped_backward
        cur.sampled = self.sampled = (self.spans and step > segment_start
                                      and (step - segment_start - 1) % self.span_every == 0)
        self.mark("ready")

    def mark(self, phase: str) -> None:
        """The end of `phase`. ddptop's cost here is split at the reading: before it `phase`'s, after it the next
        phase's. An own second must lie inside the phase it is taken out of, or it counts twice: charged whole to
        the next phase, the part before the reading also stayed in `phase`'s part (bwd, opt) or in the step's tail,
        and a thread switch there (another thread took the GIL: up to 5 ms) put the parts over the step."""
        if not self.detail and phase != "ready":
            return
        began = now()
        cur = self._cur
        cur.marks[phase] = mark = self.clock.now()
        cur.host[phase] = host = self._host(mark)
        self.own.add(host - began)
        cur.own[phase] = self.own.take()
        self.own.since(host)
        if phase == "data" and cur.sampled and self.layers is not None:
            self.layers.attach()  # after the batch arrived: a step that never starts leaves no hooks behind

    def mark_through(self, phase: str) -> None:
        """Mark `phase` and every phase before it not marked yet, in order: the user's own loop (ddptop/api.py)
        marks from hooks, and a step may skip one (a backward that did not start from the model's output)."""
        cur = self._cur
        if cur is None:
            return
        for name in PHASES[1:PHASES.index(phase) + 1]:
            if name not in cur.marks and (self.detail or name == "ready"):
                self.mark(name)

    def micro(self, phase: str, last: bool = False) -> None:
        """The end of a micro-step's `phase` (data, fwd, bwd) other than the step's own marks (accum > 1); `last`:
        the synchronized micro-step's batch is in, the unsynchronized ones end here (micro_s). Their set-aside
        time (an epoch's test while loading) and ddptop's own time are theirs: split off here as `mark` does."""
        if not self.detail:
            return
        began = now()
        cur = self._cur
        mark = self.clock.now()
        cur.micro.append((phase, mark))
        if not last:
            self.own.since(began)
            return
        cur.micro_end = mark
        cur.host["micro"] = host = mark if self._host_clock else began  # no second host reading: µs before the mark
        self.own.add(host - began)
        cur.own["micro"] = self.own.take()
        cur.aside["micro"] = cur.aside.pop("fwd", 0.0)
        self.own.since(host)

    def finish(self, loss: Any, epoch: int, batch_size: int, tokens: int = 0) -> None:
        """The step's training work is done; it ends at the next boundary (or `close`). `tokens`: 0 where the
        batches say no count."""
        cur = self._cur
        if cur.sampled and self.layers is not None:
            cur.layers = self.layers.detach()  # counts its own cost: inside `began` below it counted twice
        began = now()
        cur.comm = self.comm.take()
        cur.loss = self.clock.hold(loss)  # read on the publisher's thread: the training thread never syncs
        cur.epoch, cur.batch_size, cur.tokens, cur.finished = epoch, batch_size, tokens, True
        self.own.since(began)

    def close(self) -> None:
        """The run ended: the last step ends now (a step begun but never trained is dropped). The one wait for
        the device in a run is here, so the final flush reads completed marks."""
        end = self.clock.now()
        host = self._host(end)
        self.clock.synchronize()
        self._close(end, host)

    def _close(self, end: Any, host_end: float) -> None:
        cur, self._cur = self._cur, None
        own = self.own.take()
        if cur is None or not cur.finished:
            return
        cur.end, cur.host_end, cur.wall_end = end, host_end, self.wall()
        cur.own["tail"] = own
        self.emit(_Resolve(self, cur))

    # -- the publisher's thread -------------------------------------------------------------------------------
    def resolve(self, p: _Step) -> list[Event]:
        self._wait(p)
        rel = lambda mark: self.clock.seconds(p.t0, mark)  # noqa: E731
        end = rel(p.end)
        aside_s = sum(p.aside.values())
        iter_s = net_seconds(end, self._host_s(end, p.host_t0, p.host_end), aside_s)
        own_s = sum(p.own.values())
        threads_s = self.threads.step()
        loss = float(p.loss)  # held on the host (clock.hold): complete once the step's end mark is
        if not self.detail:
            return [StepDone(rank=self.rank, step=p.step, epoch=p.epoch, segment=p.segment, t=p.wall_end,
                             iter_s=iter_s, data_s=0.0, compute_s=0.0, comm_s=0.0, exposed_comm_s=0.0, overlap=0.0,
                             batch_size=p.batch_size, loss=loss, comm_bytes=0, tx_bytes=0, rx_bytes=0, sampled=False,
                             own_s=own_s, aside_s=aside_s, tokens=p.tokens,
                             threads_s=threads_s)]
        at = {name: rel(mark) for name, mark in p.marks.items()}
        comm = [Span(c.kind, c.name, rel(c.start), rel(c.end) - rel(c.start), c.nbytes, c.tx_bytes, c.rx_bytes)
                for c in p.comm]
        bwd_end = at["bwd"]
        if p.overlapped_backward:  # backward computes until the last bucket is launched, then waits for it
            launches = [s.start_s for s in comm if s.kind == "comm" and at["fwd"] <= s.start_s <= at["bwd"]]
            bwd_end = max(launches, default=bwd_end)

        def net(phase: str, before: str, start: float, stop: float) -> float:
            removed = p.aside.get(phase, 0.0) + p.own.get(phase, 0.0)
            return net_seconds(stop - start, self._host_s(stop - start, p.host[before], p.host[phase]), removed)

        data_s = net("data", "ready", at["ready"], at["data"])
        micro_s, fwd_from = 0.0, "data"
        if p.micro_end is not None:  # accum > 1: the unsynchronized micro-steps, then the synchronized forward
            at["micro"], fwd_from = rel(p.micro_end), "micro"
            micro_s = net("micro", "data", at["data"], at["micro"])
        fwd_s, bwd_s = net("fwd", fwd_from, at[fwd_from], at["fwd"]), net("bwd", "fwd", at["fwd"], bwd_end)
        opt_s = net("opt", "sync", at["sync"], at["opt"])
        compute = [(at["data"], at["fwd"]), (at["fwd"], bwd_end), (at["sync"], at["opt"])]
        blocking = [(s.start_s, s.end_s) for s, c in zip(comm, p.comm) if c.blocking]
        _, comm_s, exposed_s, overlap = breakdown(compute, [(s.start_s, s.end_s) for s in comm if s.kind == "comm"],
                                                  blocking)
        done = StepDone(
            rank=self.rank, step=p.step, epoch=p.epoch, segment=p.segment, t=p.wall_end, iter_s=iter_s,
            data_s=data_s, compute_s=micro_s + fwd_s + bwd_s + opt_s, comm_s=comm_s, exposed_comm_s=exposed_s,
            overlap=overlap,
            batch_size=p.batch_size, loss=loss, comm_bytes=sum(s.nbytes for s in comm),
            tx_bytes=sum(s.tx_bytes for s in comm), rx_bytes=sum(s.rx_bytes for s in comm), sampled=p.sampled,
            fwd_s=fwd_s, bwd_s=bwd_s, opt_s=opt_s, own_s=own_s, aside_s=aside_s, micro_s=micro_s, tokens=p.tokens,
            threads_s=threads_s,
        )
        if not p.sampled:
            return [done]
        spans = [Span("data", "data", at["ready"], at["data"] - at["ready"])]
        if p.layers:
            spans += [Span(kind, name, rel(a), rel(b) - rel(a)) for kind, name, a, b in p.layers]
            spans += [s for s in _micro_spans(p.micro, at["data"], rel) if s.kind == "data"]  # layers show the rest
        else:
            spans += _micro_spans(p.micro, at["data"], rel)
            last = rel(p.micro[-1][1]) if p.micro else at["data"]
            spans += [Span("fwd", "forward", last, at["fwd"] - last),
                      Span("bwd", "backward", at["fwd"], bwd_end - at["fwd"])]
        spans += comm
        spans.append(Span("opt", "optimizer", at["sync"], at["opt"] - at["sync"]))
        spans.sort(key=lambda s: s.start_s)
        return [StepSpans(rank=self.rank, step=p.step, segment=p.segment, t0=p.wall_t0, spans=tuple(spans)), done]

    def _host_s(self, clock_s: float, host_start: float, host_stop: float) -> float:
        """An interval's host duration: on CPU the probe's clock is the host's, the same duration."""
        return clock_s if self._host_clock else host_stop - host_start

    def _wait(self, p: _Step) -> None:
        """Until every mark of the step can be read. The phase and layer marks precede `end` on the training
        stream; a DDP bucket's completion is stamped on the stream its all-reduce finished on, so each comm
        mark is waited for too. A mark that has completed is not waited for: `Event.synchronize()` gives up the
        GIL and takes it back even for a completed event, the publisher resolves a quarter second of steps at
        once, and each take-back can interrupt a training thread that launches kernels under the GIL. (The first
        GPU run measured `--probes all` 1.4 ms slower than `off` per VGG-11 step on an H200, on steps without
        layer hooks; how much of that these hand-overs were is for the next GPU run to measure: README, GPUs.)"""
        ready, wait = self.clock.ready, self.clock.wait
        for mark in (p.end, *(m for c in p.comm for m in (c.start, c.end))):
            if not ready(mark):
                wait(mark)


MICRO_NAMES = {"data": "data", "fwd": "forward", "bwd": "backward (no sync)"}


def _micro_spans(marks: list, start: float, rel: Callable[[Any], float]) -> list[Span]:
    """The unsynchronized micro-steps as spans ("micro-step 1 forward", …), each from the mark before it."""
    spans, micro = [], 1
    for phase, mark in marks:
        end = rel(mark)
        micro += phase == "data"
        spans.append(Span(phase, f"micro-step {micro} {MICRO_NAMES[phase]}", start, end - start))
        start = end
    return spans


def net_seconds(clock_s: float, host_s: float, removed_s: float) -> float:
    """The step's own part of an interval `clock_s` long on the probe's clock and `host_s` long on the host's, of
    which the host spent `removed_s` set aside or in ddptop's code (never negative).

    `removed_s` is perf_counter time; on a GPU `clock_s` is CUDA-event time, and host seconds taken from device
    seconds mix two clocks (a 10 s pause with 50 ms of kernels still queued is not 10 s of device idleness). So
    the share of the interval that was the step's is found within the host clock, (host_s − removed_s) / host_s,
    and that share of `clock_s` is kept. On CPU the two durations are one (the marks are perf_counter values) and
    this is clock_s − removed_s exactly."""
    if clock_s == host_s or removed_s <= 0:  # one clock, or nothing of the host's to take out
        return max(0.0, clock_s - removed_s)
    if host_s <= removed_s:
        return 0.0
    return max(0.0, clock_s) * (host_s - removed_s) / host_s


class _Resolve:
    """A finished step waiting to become events on the publisher's thread (`resolve()`)."""

    __slots__ = ("probe", "step")

    def __init__(self, probe: StepProbe, step: _Step):
        self.probe, self.step = probe, step

    def resolve(self) -> list[Event]:
        return self.probe.resolve(self.step)
