"""Provides the timelines the model predicts: DDP's buckets beside the backward pass, and the strategies that
communicate after it (per-parameter all-reduce, sync or async, and gather+scatter)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence


@dataclass(frozen=True)
class Timeline:
    """One predicted step's backward and communication: seconds from the backward pass's start."""

    bwd_s: float  # backward compute, slowdown included
    comm_s: float  # communication time (first launch to last completion, gaps left out)
    exposed_s: float  # communication after the backward pass ended
    overlap: float  # fraction of communication time during which the backward pass ran


def overlapped(work: Sequence[float], ready_after: Sequence[int], comm: Sequence[float], compute_slowdown: float,
               comm_slowdown: float) -> Timeline:
    """Layers `work` run one after another; bucket b's all-reduce (`comm[b]` seconds alone) starts once layer
    `ready_after[b]` is done and bucket b−1's has finished (DDP launches buckets in order, one at a time on gloo).
    While both run, compute goes 1/(1+compute_slowdown) as fast and the transfer 1/(1+comm_slowdown)."""
    if not all(math.isfinite(x) and x >= 0 for x in (*work, *comm, compute_slowdown, comm_slowdown)):
        raise ValueError("the what-if timeline needs finite, non-negative times")  # inf − inf would never end
    t = busy = both = 0.0
    li, bi = 0, 0
    lrem = work[0] if work else 0.0
    brem = comm[0] if comm else 0.0
    bwd_end = 0.0 if not work else math.inf
    slow_c, slow_m = 1.0 / (1.0 + compute_slowdown), 1.0 / (1.0 + comm_slowdown)
    while li < len(work) or bi < len(comm):
        comp = li < len(work)
        talk = bi < len(comm) and li > ready_after[bi]
        if not comp and not talk:  # cannot happen (every bucket's layer ends), but never loop forever
            break
        rate_c, rate_m = (slow_c, slow_m) if comp and talk else (1.0, 1.0)
        dt = min(lrem / rate_c if comp else math.inf, brem / rate_m if talk else math.inf)
        t += dt
        if talk:
            busy += dt
            brem -= dt * rate_m
            both += dt if comp else 0.0
        if comp:
            lrem -= dt * rate_c
            if lrem <= 1e-12:
                li += 1
                lrem = work[li] if li < len(work) else 0.0
                bwd_end = t if li == len(work) else bwd_end
        if talk and brem <= 1e-12:
            bi += 1
            brem = comm[bi] if bi < len(comm) else 0.0
    bwd_end = t if bwd_end == math.inf else bwd_end
    return Timeline(bwd_end, busy, max(0.0, t - bwd_end), both / busy if busy > 0 else 0.0)


def after_backward(bwd_s: float, comm_s: float) -> Timeline:
    """Communication that starts once the backward pass is over: all of it exposed."""
    return Timeline(bwd_s, comm_s, comm_s, 0.0)
