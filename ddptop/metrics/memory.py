"""Each rank's memory by kind, per segment: the one definition the screen, `info` and the report show (pure, no torch).

From a rank's MemorySamples of one segment: parameters, gradients and optimizer state are the latest sample's (what
the rank holds in its own storage under that segment's strategy: constant once its first step has run), the peak is
the largest over the segment's samples, `now` and `reserved` the latest sample's."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from ddptop.events import MemorySample

GLOSSARY = {
    "parameters held": ("B", "bytes of the parameters in the rank's own storage (a sharded strategy's shard; a tied "
                             "weight or a view once), from the segment's latest memory sample"),
    "gradients held": ("B", "bytes of the gradients in the rank's own storage at a step's end, likewise"),
    "optimizer state held": ("B", "bytes of every tensor in the rank's optimizer state (ZeRO-1: its shard only), "
                                  "likewise"),
    "peak memory": ("B", "on a GPU, the CUDA allocator's largest allocation (max_memory_allocated) over the "
                         "segment's sample periods, with the allocator's reserved bytes beside it; on a CPU, the "
                         "largest of the process's unique memory (USS: Private_Clean + Private_Dirty of "
                         "/proc/self/smaps_rollup) read at the end of the segment's sampled steps"),
}


@dataclass(frozen=True)
class RankMemory:
    """One rank in one segment (see the module's docstring)."""

    segment: int
    rank: int
    samples: int
    step: int  # the latest sample's step
    param_bytes: int
    grad_bytes: int
    optim_bytes: int
    peak_bytes: int
    now_bytes: int
    reserved_bytes: int
    by: str
    cost_s: float  # the largest a sample cost the training thread

    @property
    def held_bytes(self) -> int:
        """Parameters + gradients + optimizer state."""
        return self.param_bytes + self.grad_bytes + self.optim_bytes


class MemoryTable:
    """RankMemory per (segment, rank), fed MemorySamples in the order they arrived."""

    def __init__(self) -> None:
        self._rows: dict[tuple[int, int], RankMemory] = {}

    def apply(self, e: MemorySample) -> None:
        key = (e.segment, e.rank)
        old = self._rows.get(key)
        peak = e.peak_bytes if old is None else max(old.peak_bytes, e.peak_bytes)
        cost = e.cost_s if old is None else max(old.cost_s, e.cost_s)
        self._rows[key] = RankMemory(e.segment, e.rank, 1 if old is None else old.samples + 1, e.step,
                                     e.param_bytes, e.grad_bytes, e.optim_bytes, peak, e.now_bytes,
                                     e.reserved_bytes, e.by, cost)

    def apply_all(self, events: Iterable[MemorySample]) -> "MemoryTable":
        for e in events:
            self.apply(e)
        return self

    def rows(self, segment: int | None = None) -> list[RankMemory]:
        """Every (segment, rank) in order, or one segment's ranks."""
        return [self._rows[k] for k in sorted(self._rows) if segment is None or k[0] == segment]

    def latest_segment(self) -> int | None:
        return max((k[0] for k in self._rows), default=None)


def memory_table(samples: Iterable[MemorySample]) -> list[RankMemory]:
    return MemoryTable().apply_all(samples).rows()


SHARDED_HELD = {"zero1": (False, False, True), "zero2": (True, True, True), "zero3": (True, True, True)}


def held_by_formula(strategy: str, param_bytes: int, world_size: int, momentum: bool = True) -> tuple[int, int, int]:
    """(parameters, gradients, optimizer state) one rank holds at a step's end by its strategy's formula, for a
    model of `param_bytes` trained with the loop's SGD (`momentum`: one buffer of the parameters' size, O = P).
    Replicated strategies hold all three whole (P, G = P, O). DeepSpeed's stages: ZeRO-1 shards the optimizer state
    (O/N), ZeRO-2 also the gradients; torch's ZeRO-2 (FSDP2 without resharding after forward) keeps the parameters
    sharded between steps too, as ZeRO-3 does: (P + G + O)/N. The drop from DDP to ZeRO-3 is (1 − 1/N)(P + G + O).
    ZeroRedundancyOptimizer's shares are whole parameters (wire.zero1_owners), so a rank's O can be far from O/N:
    this is the even share."""
    world = max(1, world_size)
    whole = (param_bytes, param_bytes, param_bytes if momentum else 0)
    sharded = SHARDED_HELD.get(strategy, (False, False, False))
    return tuple(-(-b // world) if cut else b for b, cut in zip(whole, sharded))  # type: ignore[return-value]

