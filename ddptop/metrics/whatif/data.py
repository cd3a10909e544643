"""Provides what the what-if model is fitted from: one segment's measured parts and its sampled spans (pure data)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

# the collective kinds the link is fitted for; a DDP bucket is a ring all-reduce
KINDS = ("allreduce", "gather", "scatter", "broadcast")


@dataclass(frozen=True)
class CommSample:
    """One collective on one sampled step, pooled over ranks: its bytes, its transfer time and how much of that
    time the backward pass ran beside it (on the rank that arrived last, whose span is the transfer itself)."""

    kind: str  # one of KINDS
    nbytes: int  # tensor bytes handed to the collective
    dur_s: float
    overlap_s: float = 0.0


@dataclass(frozen=True)
class LayerTime:
    """One backward layer on a sampled step: its time (from the previous layer's end, so gaps count) and the part
    of it that communication ran beside."""

    name: str
    dur_s: float
    overlap_s: float = 0.0


@dataclass(frozen=True)
class SegmentData:
    """One configuration segment of a recording, reduced to what the model needs (means over ranks)."""

    segment: int
    config: Mapping  # strategy, bucket_mb, async_op, batch_size, accum, compress
    world_size: int
    layers: tuple[tuple[str, int], ...]  # (layer, parameter count) in definition order
    param_bytes: int
    param_tensors: int
    step_s: float  # measured: the slowest rank's mean step time
    step_se_s: float = 0.0  # that mean's standard error (metrics.Figures.step_se_s): every prediction inherits it
    data_s: float = 0.0
    fwd_s: float = 0.0
    bwd_s: float = 0.0  # backward compute (what waiting on the last bucket adds is exposed_comm_s)
    opt_s: float = 0.0
    rest_s: float = 0.0  # ddptop's own time and `other`
    comm_s: float = 0.0
    exposed_comm_s: float = 0.0
    # sampled steps: each a list of backward layers in the order they ran
    backward: tuple[tuple[LayerTime, ...], ...] = ()
    comm: tuple[CommSample, ...] = ()
    link_bps: float | None = None  # the link the segment ran on (bits/s each way), when known
    param_shapes: tuple[tuple[int, ...], ...] = ()  # each gradient's shape (PowerSGD's bytes; older files: ())
    # DDP buckets that no other bucket ran beside (on every rank), each on its own: what tells a transfer beside the
    # backward pass from one alone within one segment (link.fit_comm_slowdown)
    isolated: tuple[CommSample, ...] = ()
    # α (seconds per ring step) fitted on another segment of the recording, and which (inputs.latency); None: none
    latency: tuple[int, float] | None = None
    # the collectives' ("gloo", "nccl"; older files: "", all gloo): which constants hold there, and how a
    # reduce-scatter runs (gloo: as an all-reduce)
    backend: str = ""

    def units(self) -> list[int]:
        """Bytes per top-level block of the model, in order: the zero strategies' default sharding units."""
        out: dict[str, float] = {}
        for name, count in self.layers:
            out[name.split(".")[0]] = out.get(name.split(".")[0], 0.0) + count * self.bytes_per_param
        return [round(b) for b in out.values() if b > 0]

    @property
    def bytes_per_param(self) -> float:
        count = sum(c for _, c in self.layers)
        return self.param_bytes / count if count else 4.0
