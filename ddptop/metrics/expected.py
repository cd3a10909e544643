"""Provides the bytes a strategy should put on the wire per step, from the wire formulas (ring, gather, scatter)."""

from __future__ import annotations

from typing import Mapping

from ddptop.events import RunStarted
from ddptop.metrics.wire import (broadcast_shares, compressed, gather, powersgd_allreduce, reduce_scatter, ring_all_gather,
                                 ring_allreduce, scatter, zero1_owners)


def expected_bytes(run: RunStarted | None, config: Mapping, rank: int) -> tuple[int, int]:
    """(sent, received) per step by `rank` under `config`, for gradients of `run.param_bytes` bytes.

    single sends nothing; allreduce and ddp move 2(N−1)/N·S each way (ring); gather-scatter moves
    (N−1)·S in and out at rank 0 and S each way at the others. fp16/bf16 halve S; PowerSGD (after its warm-up
    of plain all-reduce steps) sends its factors and the uncompressed tensors (wire.powersgd_allreduce).
    A step is one optimizer step: accumulation leaves its bytes as they are (one sync per step), except under
    zero2/zero3, whose units all-gather in every micro-step (FSDP2). zero1 (torch: DDP's all-reduce, then
    ZeroRedundancyOptimizer's broadcast of each rank's share, whole parameters as torch partitions them:
    wire.zero1_owners, wire.broadcast_shares) moves 2(N−1)/N·S plus the broadcasts; zero2 all-gathers K times and
    reduce-scatters once, zero3 all-gathers in forward and again in backward: (K or 2K)·(N−1)/N·S plus the
    reduce-scatter, (N−1)/N·S under NCCL and 2(N−1)/N·S under gloo, which runs it as an all-reduce
    (wire.reduce_scatter). Recordings without the backend (before ZeRO) count as NCCL would.
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
    backend = getattr(run, "backend", "")
    if strategy == "zero1":
        ring = ring_allreduce(size, world)
        if world <= 1:
            return ring
        if run.param_shapes:
            numels = [_numel(shape) for shape in run.param_shapes]
            per_value = run.param_bytes / max(1, sum(numels))
            owners = zero1_owners(numels, world)
            shares = [round(per_value * sum(n for n, o in zip(numels, owners) if o == r)) for r in range(world)]
        else:  # a recording without the shapes: even shares
            shares = [size // world] * world
        sent, received = broadcast_shares(shares, rank, backend)
        return ring[0] + sent, ring[1] + received
    if strategy in ("zero2", "zero3"):
        accum = int(config.get("accum", 1) or 1)
        share, _ = ring_all_gather(size, world)
        gathers = (2 if strategy == "zero3" else 1) * accum
        rs_sent, rs_received = reduce_scatter(size, world, backend)
        return gathers * share + rs_sent, gathers * share + rs_received
    if strategy == "gather-scatter":
        g_tx, g_rx = gather(size, world, rank == 0)
        s_tx, s_rx = scatter(size, world, rank == 0)
        return g_tx + s_tx, g_rx + s_rx
    return 0, 0


def _numel(shape) -> int:
    count = 1
    for dim in shape:
        count *= dim
    return count


def formula(strategy: str) -> str:
    """The formula behind `expected_bytes`, for the screen."""
    return {"allreduce": "ring 2(N−1)/N·S each way", "ddp": "ring 2(N−1)/N·S each way",
            "gather-scatter": "rank 0: (N−1)·S each way, others S", "single": "nothing",
            "zero1": "all-reduce 2(N−1)/N·S + each share's broadcast", "zero2": "K·(N−1)/N·S + reduce-scatter",
            "zero3": "2K·(N−1)/N·S + reduce-scatter (gloo: an all-reduce)"}.get(strategy, "?")
