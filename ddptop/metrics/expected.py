"""Provides the bytes a strategy should put on the wire per step, from the wire formulas (ring, gather, scatter)."""

from __future__ import annotations

from typing import Mapping

from ddptop.events import RunStarted
from ddptop.metrics.wire import compressed, gather, powersgd_allreduce, ring_all_gather, ring_allreduce, scatter


def expected_bytes(run: RunStarted | None, config: Mapping, rank: int) -> tuple[int, int]:
    """(sent, received) per step by `rank` under `config`, for gradients of `run.param_bytes` bytes.

    single sends nothing; allreduce and ddp move 2(N−1)/N·S each way (ring); gather-scatter moves
    (N−1)·S in and out at rank 0 and S each way at the others. fp16/bf16 halve S; PowerSGD (after its warm-up
    of plain all-reduce steps) sends its factors and the uncompressed tensors (wire.powersgd_allreduce).
    A step is one optimizer step: accumulation leaves its bytes as they are (one sync per step), except under
    zero2/zero3, whose units all-gather in every micro-step (FSDP2). zero1 (torch: DDP's all-reduce, then
    ZeroRedundancyOptimizer's parameter broadcasts) moves 2(N−1)/N·S + (N−1)/N·S; zero2 (all-gather K times,
    reduce-scatter once) (K+1)·(N−1)/N·S; zero3 (all-gather in forward and again in backward) (2K+1)·(N−1)/N·S.
    """
    if run is None:
        return 0, 0
    compress = str(config.get("compress", "none"))
    size, world = compressed(run.param_bytes, compress), run.world_size
    strategy = config.get("strategy", run.strategy)
    if strategy == "ddp" and compress.startswith("powersgd") and run.param_shapes:
        _, sent, received = powersgd_allreduce(list(run.param_shapes), int(compress.partition(":")[2] or 1), world)
        return sent, received
    if strategy in ("allreduce", "ddp"):
        return ring_allreduce(size, world)
    if strategy in ("zero1", "zero2", "zero3"):
        accum = int(config.get("accum", 1) or 1)
        share, _ = ring_all_gather(size, world)
        times = {"zero1": 3, "zero2": accum + 1, "zero3": 2 * accum + 1}[strategy]
        return times * share, times * share
    if strategy == "gather-scatter":
        g_tx, g_rx = gather(size, world, rank == 0)
        s_tx, s_rx = scatter(size, world, rank == 0)
        return g_tx + s_tx, g_rx + s_rx
    return 0, 0


def formula(strategy: str) -> str:
    """The formula behind `expected_bytes`, for the screen."""
    return {"allreduce": "ring 2(N−1)/N·S each way", "ddp": "ring 2(N−1)/N·S each way",
            "gather-scatter": "rank 0: (N−1)·S each way, others S", "single": "nothing",
            "zero1": "all-reduce + broadcasts 3(N−1)/N·S each way", "zero2": "(K+1)(N−1)/N·S each way",
            "zero3": "(2K+1)(N−1)/N·S each way"}.get(strategy, "?")
