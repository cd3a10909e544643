"""Provides the model's constants for one segment, each with where it came from: fitted on the segment where its
data can tell, else the CPU lab's figure where the segment ran as the lab did, else assumed 0, and said so.

The lab's figures (compute.py, link.py, model.py) were read off gloo on CPU hosts, where the same cores compute,
copy and move every byte. On nccl the GPU computes and copies while its own engines move the bytes: none of them
holds there. Nor on gloo does a figure that the segment itself contradicts (a copy cost longer than half of the
measured backward pass, a latency longer than half of the shortest measured collective): the host is not the lab's.
"""

from __future__ import annotations

from dataclasses import dataclass

from ddptop.metrics.buckets import ddp_buckets
from ddptop.metrics.whatif.compute import COMM_SLOWDOWN, COMPUTE_SLOWDOWN
from ddptop.metrics.whatif.data import SegmentData
from ddptop.metrics.whatif.link import DEFAULT_ALPHA, latency_steps

# DDP's backward pass also copies every gradient into its bucket (and the result back): 0.249 s of backward at
# 50 MB buckets (no overlap) against 0.169 s under per-parameter all_reduce, VGG-11's 36.9 MB on the lab's
# 0.67-core hosts: 2.2 ns a byte (README "What-if / advise")
DDP_COPY_S_PER_BYTE = 2.2e-9
LAB = "the CPU lab's (gloo, 3 hosts of 0.67 core; docs/evidence/whatif.md)"
# a figure that takes more than these shares of what the segment measured is not this host's. The copy: 32% of
# VGG-11's backward pass at 1 Gbit/s, 52% on the lab's unshaped link (benchmarks/whatif-grid, where gloo took less
# CPU from the backward pass); a GPU's 8 ms backward pass would hold 81 ms of it. α·steps of every all-reduce one
# sample pools, against the shortest such sample: 2% at the lab's 25 MB buckets; 436% on live-switch.db (loopback)
COPY_MAX_SHARE = 0.8
MAX_SHARE = 0.5


@dataclass(frozen=True)
class Constant:
    """One constant of the fit: its name, value (unit), and where the value came from."""

    name: str
    value: float
    unit: str
    source: str

    def describe(self) -> str:
        scale, unit = {"s/B": (1e9, "ns/B"), "s": (1e3, "ms")}.get(self.unit, (1.0, self.unit))
        return f"{self.name} {self.value * scale:.3g}{(' ' + unit) if unit else ''}: {self.source}"

    def to_dict(self) -> dict:
        return {"name": self.name, "value": self.value, "unit": self.unit, "source": self.source}


def lab_like(seg: SegmentData) -> bool:
    """The segment's collectives ran on gloo (the host's CPU moves the bytes), as the lab's did; older files name no
    backend and were all gloo."""
    return seg.backend in ("", "gloo")


def _not_lab(seg: SegmentData) -> str:
    return f"assumed 0: the CPU lab's gloo figure is not applied to {seg.backend}"


def alpha(seg: SegmentData) -> Constant:
    """The latency per ring step that link.fit_line takes where the collectives' sizes cannot separate it."""
    name = "collective latency"
    if seg.latency is not None:
        return Constant(name, seg.latency[1], "s", f"fitted on segment {seg.latency[0]}'s per-parameter all_reduces")
    if not lab_like(seg):
        return Constant(name, 0.0, "s", _not_lab(seg) + " (bandwidth only)")
    shortest = min((s.dur_s for s in seg.comm if s.kind == "allreduce" and s.dur_s > 0), default=None)
    latency = DEFAULT_ALPHA * latency_steps("allreduce", seg.world_size) * _collectives(seg)
    if shortest is not None and latency > MAX_SHARE * shortest:
        # capped, not 0: a per-tensor all_reduce still waits for its ring steps, and a cap errs toward the
        # configuration in force (on live-switch.db, 0 predicted allreduce 33% too fast, the lab's 33% too slow)
        capped = DEFAULT_ALPHA * MAX_SHARE * shortest / latency
        return Constant(name, capped, "s", f"capped: the lab's {DEFAULT_ALPHA * 1e3:g} ms a ring step would be "
                        f"{latency * 1e3:.3g} ms of this segment's shortest all-reduce ({shortest * 1e3:.3g} ms): "
                        f"taken as half of it")
    return Constant(name, DEFAULT_ALPHA, "s", f"{LAB}, per ring step")


def _collectives(seg: SegmentData) -> int:
    """How many all-reduces one sample of seg.comm holds: a DDP step's buckets are pooled into one (inputs._as_one)."""
    if seg.config.get("strategy") != "ddp":
        return 1
    return max(1, len(ddp_buckets(seg.layers, seg.bytes_per_param, float(seg.config.get("bucket_mb", 25.0)))))


def comm_slowdown(seg: SegmentData, fitted: float | None) -> Constant:
    name = "comm slowdown"
    if fitted is not None:
        return Constant(name, fitted, "", f"fitted on segment {seg.segment}'s buckets")
    if not lab_like(seg):
        return Constant(name, 0.0, "", _not_lab(seg))
    return Constant(name, COMM_SLOWDOWN, "", LAB + ": the segment's buckets cannot tell")


def compute_slowdown(seg: SegmentData) -> Constant:
    name = "compute slowdown"
    if not lab_like(seg):
        return Constant(name, 0.0, "", _not_lab(seg))
    return Constant(name, COMPUTE_SLOWDOWN, "", LAB + ": one segment's steps all overlap alike")


def copy_cost(seg: SegmentData) -> Constant:
    """What DDP's bucket copies add to the backward pass per byte of parameters (0 off DDP: none made)."""
    name = "DDP bucket copy"
    if not lab_like(seg):
        return Constant(name, 0.0, "s/B", _not_lab(seg) + " (a device copy)")
    lab_s = DDP_COPY_S_PER_BYTE * seg.param_bytes
    if lab_s > COPY_MAX_SHARE * seg.bwd_s:
        return Constant(name, 0.0, "s/B", f"assumed 0: the lab's {DDP_COPY_S_PER_BYTE * 1e9:g} ns/B would be "
                        f"{lab_s * 1e3:.3g} ms of this segment's {seg.bwd_s * 1e3:.3g} ms backward pass")
    return Constant(name, DDP_COPY_S_PER_BYTE, "s/B", LAB)
