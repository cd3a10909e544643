"""Bytes a collective puts on the wire per rank, by its algorithm (the formulas users compare NIC counters with)."""

from __future__ import annotations


def ring_allreduce(nbytes: int, world_size: int) -> tuple[int, int]:
    """(sent, received) by one rank in a ring all-reduce of `nbytes`: 2(N−1)/N·S each way."""
    if world_size <= 1:
        return 0, 0
    each = 2 * (world_size - 1) * nbytes // world_size
    return each, each


def gather(nbytes: int, world_size: int, is_root: bool) -> tuple[int, int]:
    """Gather to the root: the root receives (N−1)·S, every other rank sends S."""
    if world_size <= 1:
        return 0, 0
    return (0, (world_size - 1) * nbytes) if is_root else (nbytes, 0)


def scatter(nbytes: int, world_size: int, is_root: bool) -> tuple[int, int]:
    """Scatter from the root: the root sends (N−1)·S, every other rank receives S."""
    if world_size <= 1:
        return 0, 0
    return ((world_size - 1) * nbytes, 0) if is_root else (0, nbytes)
