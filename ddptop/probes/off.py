"""`--probes off` and `--probes system`: only what the progress line needs (iteration time and loss)."""

from __future__ import annotations

import time
from typing import Any

from ddptop.events import Event, StepDone
from ddptop.probes.comm import NullRecorder


class MinimalStepProbe:
    """Same interface as StepProbe; one perf_counter per step, no spans, no comm timing."""

    def __init__(self, rank: int):
        self.rank = rank
        self.comm = NullRecorder()
        self._out: list[Event] = []

    def watch(self, model, overlapped_backward: bool) -> None:
        pass

    def start(self, step: int) -> None:
        self._t0 = time.perf_counter()

    def mark(self, phase: str) -> None:
        pass

    def finish(self, loss: Any, **info: Any) -> None:
        iter_s = time.perf_counter() - self._t0
        self._out.append(StepDone(
            rank=self.rank, step=info["step"], epoch=info["epoch"], segment=info["segment"], t=time.time(),
            iter_s=iter_s, data_s=0.0, compute_s=0.0, comm_s=0.0, exposed_comm_s=0.0, overlap=0.0,
            batch_size=info["batch_size"], loss=float(loss.item()), comm_bytes=0, tx_bytes=0, rx_bytes=0,
            sampled=False,
        ))

    def drain(self, flush: bool = False) -> list[Event]:
        out, self._out = self._out, []
        return out
