"""Provides what gradient accumulation and compression change in the what-if model (issue 25): a step's extra
micro-steps, the bytes a compressed gradient puts on the wire (ddptop.metrics.wire) and the CPU work compressing it.

accum K: K micro-steps per optimizer step, the first K−1 without any sync (DDP under no_sync), one sync per step; so
the communication is a plain step's and each extra micro-step costs its data, forward and backward.
compress: fp16/bf16 hand each gradient to the collective as 2-byte values (S/2 on the wire) after a cast; PowerSGD
rank R sends three ring all-reduces (the tensors it leaves whole, all P factors, all Q factors) after its matrix work.
The accum rows miss by −10% to −43% on the lab recordings, not from a quota: the runs' CPU per micro-step matched
the plain step's (q4: 0.036-0.040 s against 0.038-0.039 s) at 13-21% of the nodes' quota, while the wall time per
CPU second varied 3.7-5.9× with the machine's load (README "What-if / advise"). No constant here would be physics.
"""

from __future__ import annotations

from ddptop.metrics import wire
from ddptop.metrics.whatif.link import Line

# The cast to 2 bytes and back, seconds per float32 gradient byte, on top of the halved transfer: what wire-lab.db
# (3 hosts of 0.67 core, 1 Gbit/s, the wide MLP's 7.36 MB in one 25 MB bucket, DDP batch 32) measured beyond the
# model's prediction for the halved bytes alone (0.182 s): fp16 0.202 s (+20 ms: 2.7 ns a byte), bf16 0.248 s
# (+65 ms: 8.9 ns a byte; torch's CPU bf16 cast rounds value by value). Read off the file the README checks them
# on, so those rows are in-sample (README "What-if / advise").
CAST_S_PER_BYTE = {"fp16": 2.7e-9, "bf16": 8.9e-9}
# PowerSGD's matrix work (P = MQ, Q = MᵀP, the decompression PQᵀ, its error feedback) per multiply-add of its three
# n×m×r products: wire-lab.db's powersgd:32 segment, 0.443 s measured against 0.142 s predicted for its 0.82 MB of
# factors alone, 176 M multiply-adds a step: 1.7 ns each (in-sample, as above).
POWERSGD_S_PER_MAC = 1.7e-9
COMPRESSIONS = ("none", "fp16", "bf16", "powersgd")


def accum_of(config) -> int:
    """A segment's micro-steps per step, from its config mapping (a recording from before accumulation: 1)."""
    return max(1, int(config.get("accum", 1) or 1))


def compress_of(config) -> str:
    """A segment's compression, from its config mapping (a recording from before compression: none)."""
    return str(config.get("compress", "none"))


def check(strategy: str, compress: str, accum: int) -> None:
    """Refuse what no run can do: PowerSGD outside DDP (torch's comm hooks are DDP's), compression on single."""
    kind = compress.partition(":")[0]
    if kind not in COMPRESSIONS:
        raise ValueError(f"unknown compression {compress!r} (none, fp16, bf16, powersgd[:R])")
    if accum < 1:
        raise ValueError(f"accum must be ≥ 1, got {accum}")
    if kind == "powersgd" and strategy != "ddp":
        raise ValueError("PowerSGD is a DDP comm hook: it predicts only for ddp")
    if kind != "none" and strategy == "single":
        raise ValueError("single sends nothing to compress")


def powersgd_rank(compress: str) -> int:
    return int(compress.partition(":")[2] or 1)


def micro_s(data_s: float, fwd_s: float, bwd_s: float, accum: int) -> float:
    """One micro-step's data, forward and backward from a segment's mean step parts. The step's forward and
    backward marks are its last micro-step's, and the segment's forward holds the K−1 micro-steps before it (a
    step's micro_s, which inputs.parts adds back: README's glossary, K−1 micro-steps), so data + forward + backward
    is K micro-steps' work. Measured backward is kept whole: a no_sync backward skips DDP's bucket copies, but the
    lab's 2.2 ns a byte would leave the wide MLP's 13.8 ms backward (7.36 MB: 16 ms) nothing."""
    return (data_s + fwd_s + bwd_s) / max(1, accum)


def transfer(line: Line, kind: str, nbytes: float, world: int, beta: float | None, compress: str,
             shapes: tuple[tuple[int, ...], ...], param_bytes: int) -> float:
    """Seconds for one collective of `nbytes` float32 gradient bytes under `compress`, its CPU work included."""
    family = compress.partition(":")[0]
    if family in ("fp16", "bf16"):
        return line.time(kind, wire.compressed(int(nbytes), family), world, beta) + CAST_S_PER_BYTE[family] * nbytes
    if family != "powersgd":
        return line.time(kind, nbytes, world, beta)
    share = nbytes / param_bytes if param_bytes else 1.0  # this bucket's part of the whole model's factors
    rank = powersgd_rank(compress)
    parts = wire.powersgd_values([tuple(s) for s in shapes], rank)
    talk = sum(line.time("allreduce", 4 * values * share, world, beta) for values in parts)
    return talk + POWERSGD_S_PER_MAC * powersgd_macs(shapes, rank) * share


def powersgd_macs(shapes: tuple[tuple[int, ...], ...], rank: int) -> int:
    """Multiply-adds of PowerSGD's three products over the tensors it compresses (wire.powersgd_values' rule)."""
    return sum(3 * n * m * r for n, m, r, small in wire.powersgd_views([tuple(s) for s in shapes], rank) if small)
