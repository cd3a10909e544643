"""Per-step measurement: phase marks, comm and layer spans in, StepDone and StepSpans events out."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from ddptop.events import Event, Span, StepDone, StepSpans
from ddptop.probes.comm import CommMark, CommRecorder
from ddptop.probes.layers import LayerProbe
from ddptop.probes.timeline import COMPUTE_KINDS, breakdown

PHASES = ("data", "fwd", "bwd", "sync", "opt")


@dataclass
class _Pending:
    """A finished step whose clock marks may not be resolvable yet (CUDA events still in flight)."""

    info: dict
    t0: Any
    marks: dict[str, Any]
    comm: list[CommMark]
    layers: list
    loss: Any
    sampled: bool
    wall_t0: float
    wall_end: float
    extra: list = field(default_factory=list)


class StepProbe:
    """Owns a rank's clock, comm recorder and layer hooks; turns each step into events."""

    def __init__(self, rank: int, clock: Any, comm: CommRecorder, span_every: int, spans: bool):
        self.rank = rank
        self.clock = clock
        self.comm = comm
        self.span_every = span_every
        self.spans = spans
        self.layers: LayerProbe | None = None
        self.overlapped_backward = False  # DDP: buckets go out during backward, which waits for the last ones
        self._pending: list[_Pending] = []
        self._marks: dict[str, Any] = {}

    def watch(self, model, overlapped_backward: bool) -> None:
        """Called when a configuration segment starts with the plain (unwrapped) model."""
        self.layers = LayerProbe(model, self.clock) if self.spans else None
        self.overlapped_backward = overlapped_backward

    def start(self, step: int) -> None:
        self.sampled = self.spans and step % self.span_every == 0
        self.comm.take()  # drop anything left from an aborted step
        self._wall_t0 = time.time()
        self._t0 = self.clock.now()
        self._marks = {}

    def mark(self, phase: str) -> None:
        self._marks[phase] = self.clock.now()
        if phase == "data" and self.sampled and self.layers is not None:
            self.layers.attach()  # after the batch arrived: a step that never starts leaves no hooks behind

    def finish(self, loss: Any, **info: Any) -> None:
        layers = self.layers.detach() if self.sampled and self.layers is not None else []
        self._pending.append(
            _Pending(info, self._t0, self._marks, self.comm.take(), layers, loss.detach(), self.sampled,
                     self._wall_t0, time.time())
        )

    def drain(self, flush: bool = False) -> list[Event]:
        """Events of every finished step whose marks are resolved (all of them when `flush`)."""
        out: list[Event] = []
        while self._pending and (flush or self.clock.ready(self._pending[0].marks["opt"])):
            out.extend(self._resolve(self._pending.pop(0)))
        return out

    def _resolve(self, p: _Pending) -> list[Event]:
        rel = lambda mark: self.clock.seconds(p.t0, mark)  # noqa: E731
        phase = {name: rel(m) for name, m in p.marks.items()}
        comm = [Span(c.kind, c.name, rel(c.start), rel(c.end) - rel(c.start), c.nbytes, c.tx_bytes, c.rx_bytes)
                for c in p.comm]
        spans = [Span("data", "data", 0.0, phase["data"])]
        if p.layers:
            spans += [Span(kind, name, rel(a), rel(b) - rel(a)) for kind, name, a, b in p.layers]
        else:
            bwd_end = phase["bwd"]
            if self.overlapped_backward:
                launches = [s.start_s for s in comm if s.kind == "comm" and s.start_s <= bwd_end]
                bwd_end = max(launches, default=bwd_end)
            spans += [Span("fwd", "forward", phase["data"], phase["fwd"] - phase["data"]),
                      Span("bwd", "backward", phase["fwd"], bwd_end - phase["fwd"])]
        spans += comm
        spans.append(Span("opt", "optimizer", phase["sync"], phase["opt"] - phase["sync"]))
        compute_s, comm_s, exposed_s, overlap = breakdown(
            [(s.start_s, s.end_s) for s in spans if s.kind in COMPUTE_KINDS],
            [(s.start_s, s.end_s) for s in comm if s.kind == "comm"],
        )
        info = p.info
        done = StepDone(
            rank=self.rank, step=info["step"], epoch=info["epoch"], segment=info["segment"], t=p.wall_end,
            iter_s=phase["opt"], data_s=phase["data"], compute_s=compute_s, comm_s=comm_s,
            exposed_comm_s=exposed_s, overlap=overlap, batch_size=info["batch_size"], loss=float(p.loss.item()),
            comm_bytes=sum(s.nbytes for s in comm), tx_bytes=sum(s.tx_bytes for s in comm),
            rx_bytes=sum(s.rx_bytes for s in comm), sampled=p.sampled,
        )
        if not p.sampled:
            return [done]
        spans.sort(key=lambda s: s.start_s)
        return [StepSpans(rank=self.rank, step=info["step"], segment=info["segment"], t0=p.wall_t0,
                          spans=tuple(spans)), done]
