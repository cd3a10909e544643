"""Provides the compute side of the model: the backward pass layer by layer (when each gradient is ready) and the
slowdown compute and communication suffer while they run side by side.

gloo moves bytes with the host's CPU, so a bucket all-reduced during the backward pass takes CPU from it: in the
lab (0.5-core hosts) the backward pass ran 19% longer at 5 MB buckets (README, `cs744-lab-buckets`), as Echo and
Proteus model for GPUs. Here both sides run slower while they overlap, each by its own factor; the factors are
the lab's, measured (below): a segment's steps all overlap about alike, so one segment cannot separate them from
the work itself.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Sequence

from ddptop.metrics.whatif.data import LayerTime, SegmentData

# While a transfer runs beside it, the backward pass goes 1/(1+COMPUTE_SLOWDOWN) as fast, the transfer
# 1/(1+COMM_SLOWDOWN). One DDP segment cannot tell them from the work itself (every step overlaps about alike), so
# they are the lab's (3 hosts of 0.67 core, 1 Gbit/s, VGG-11 batch 8, README "What-if / advise"): backward 0.332 s
# at 25 MB buckets (0.13 s beside communication) against 0.249 s at 50 MB (none); the buckets' 0.443 s against
# 0.420 s for the same bytes alone. The transfer's is fitted on the segment where its buckets can tell
# (link.fit_comm_slowdown: 2.8× on an unshaped link, where the transfer is the CPU's); COMM_SLOWDOWN is the fallback.
COMPUTE_SLOWDOWN = 0.6
COMM_SLOWDOWN = 0.2


@dataclass(frozen=True)
class Backward:
    """The backward pass without slowdown: layers in the order they ran, each one's seconds."""

    names: tuple[str, ...]
    work: tuple[float, ...]

    @property
    def total(self) -> float:
        return sum(self.work)


def fit_backward(seg: SegmentData, slowdown: float) -> Backward:
    """Per-layer backward times from the sampled steps, with the slowdown taken out, scaled to the measured
    (unsampled) steps' backward time less its own slowdown: sampled steps run layer hooks, so only their shares
    are used."""
    steps = [s for s in seg.backward if s]
    if not steps:
        names = tuple(name for name, _ in reversed(seg.layers))
        return Backward(names, tuple(seg.bwd_s / max(1, len(names)) for _ in names))
    names = tuple(t.name for t in steps[0])
    pure: dict[str, list[float]] = {}
    measured = slowed = 0.0
    for step in steps:
        for t in step:
            p = (t.dur_s - t.overlap_s) + t.overlap_s / (1 + slowdown)
            pure.setdefault(t.name, []).append(p)
            measured += t.dur_s
            slowed += p
    mean = [statistics.fmean(pure.get(n, [0.0])) for n in names]
    total = sum(mean) or 1.0
    target = seg.bwd_s * (slowed / measured if measured > 0 else 1.0)
    return Backward(names, tuple(m / total * target for m in mean))


def layer_times(step: Sequence[tuple[str, float, float]], comm: Sequence[tuple[float, float]]) -> tuple[LayerTime, ...]:
    """Backward spans (name, start, end) of one step → LayerTime from the previous layer's end, with the part of it
    that the communication intervals `comm` covered."""
    out = []
    prev = step[0][1] if step else 0.0
    for name, start, end in step:
        a, b = min(prev, start), end
        covered = sum(max(0.0, min(b, ce) - max(a, cs)) for cs, ce in comm)
        out.append(LayerTime(name, b - a, min(covered, b - a)))
        prev = end
    return tuple(out)
