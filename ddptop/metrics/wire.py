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


HALF_BYTES = 2  # fp16 and bf16: a float32 gradient (4 bytes a value) travels in half the bytes
POWERSGD_MIN_RATE = 2  # torch's PowerSGDState.min_compression_rate default: compress only what shrinks 2×


def compressed(nbytes: int, compress: str) -> int:
    """The bytes a float32 gradient of `nbytes` is handed to a collective as under fp16/bf16 (S/2); else S."""
    return nbytes * HALF_BYTES // 4 if compress in ("fp16", "bf16") else nbytes


def powersgd_views(shapes: list[tuple[int, ...]], rank: int) -> list[tuple[int, int, int, bool]]:
    """(n, m, r, compressed) per tensor, as torch's powerSGD_hook decides: each viewed as n × m (n = its first
    dimension, m the rest; a vector is n × 1) with r = min(n, m, R), compressed when (n+m)·r·2 < n·m."""
    out = []
    for shape in shapes:
        n = shape[0] if shape else 1
        m = 1
        for dim in shape[1:]:
            m *= dim
        r = min(n, m, rank)
        out.append((n, m, r, (n + m) * r * POWERSGD_MIN_RATE < n * m))
    return out


def powersgd_values(shapes: list[tuple[int, ...]], rank: int) -> tuple[int, int, int]:
    """(uncompressed, P, Q) values PowerSGD's hook all-reduces per step for gradients of `shapes`: a compressed
    tensor (powersgd_views) is sent as P (n×r) and Q (m×r), any other whole."""
    whole = p = q = 0
    for n, m, r, small in powersgd_views(shapes, rank):
        if small:
            p, q = p + n * r, q + m * r
        else:
            whole += n * m
    return whole, p, q


def powersgd_allreduce(shapes: list[tuple[int, ...]], rank: int, world_size: int,
                       value_bytes: int = 4) -> tuple[int, int, int]:
    """(tensor bytes, sent, received) per rank for one PowerSGD step: three ring all-reduces (the uncompressed
    tensors batched together, all Ps, all Qs) of float32 values, each 2(N−1)/N of its size."""
    sizes = [values * value_bytes for values in powersgd_values(shapes, rank)]
    sent = sum(ring_allreduce(size, world_size)[0] for size in sizes)
    return sum(sizes), sent, sent


def ring_all_gather(nbytes: int, world_size: int) -> tuple[int, int]:
    """(sent, received) by one rank in a ring all-gather (or reduce-scatter) whose full tensor is `nbytes`:
    (N−1)/N·S each way (FSDP2's per-unit collectives, ZeRO's formulas)."""
    if world_size <= 1:
        return 0, 0
    each = (world_size - 1) * nbytes // world_size
    return each, each
