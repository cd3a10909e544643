"""Provides the what-if model: `fit(segment)` from one segment's data, `predict(model, config)` for one other
configuration, `predict_table(segment)` for the whole grid a user chooses from. Gradient accumulation and
compression: settings.py."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Iterable, Mapping, Sequence

from ddptop.metrics.buckets import ddp_buckets
from ddptop.metrics.memory import held_by_formula
from ddptop.metrics.whatif import constants
from ddptop.metrics.whatif.compute import COMM_SLOWDOWN, COMPUTE_SLOWDOWN, Backward, fit_backward
from ddptop.metrics.whatif.constants import DDP_COPY_S_PER_BYTE, Constant
from ddptop.metrics.whatif.data import SegmentData
from ddptop.metrics.whatif.link import Line, fit_comm_slowdown, fit_links
from ddptop.metrics.whatif.settings import accum_of, check, compress_of, micro_s, transfer
from ddptop.metrics.whatif.simulate import Timeline, after_backward, overlapped

ZERO = ("zero1", "zero2", "zero3")

BUCKETS_MB = (1.0, 5.0, 10.0, 25.0, 50.0, 100.0)
# async_op launches every all_reduce at once: the transfers still share the link, but the training thread's
# hand-off between collectives overlaps the previous one, saving ASYNC_SAVES of each α after the first (the lab:
# 0.516 s of communication async against 0.579 s sync, 33 hand-offs of 3.6 ms: 0.53; README "What-if / advise")
ASYNC_SAVES = 0.5


@dataclass(frozen=True)
class Config:
    """One configuration to predict. link_bps: bits/s each way (None: as recorded); 0.0 means unlimited."""

    strategy: str
    bucket_mb: float | None = None
    async_op: bool = False
    world_size: int | None = None  # None: as recorded
    link_bps: float | None = None
    accum: int = 1  # micro-steps per optimizer step
    compress: str = "none"  # none, fp16, bf16, powersgd:R


@dataclass(frozen=True)
class Model:
    """The fitted model: the segment's parts that no configuration changes, the backward pass without slowdown,
    the link per collective kind, and `calibration_s` (what the measured step holds beyond them)."""

    seg: SegmentData
    backward: Backward
    links: Mapping[str, Line]
    calibration_s: float
    cpu_s_per_byte: float | None  # β less the recorded link's 8/rate: the CPU's share of a byte (None: link unknown)
    micro_s: float = 0.0  # one micro-step's data, forward and backward (settings.micro_s)
    comm_slowdown: float = COMM_SLOWDOWN  # the segment's own (link.fit_comm_slowdown) where it can tell, else the lab's
    compute_slowdown: float = COMPUTE_SLOWDOWN
    copy_s_per_byte: float = DDP_COPY_S_PER_BYTE
    constants: tuple[Constant, ...] = ()  # each constant above and α, with where it came from (constants.py)

    @property
    def fixed_s(self) -> float:
        """The step less its backward and exposed communication, at one micro-step a step."""
        s = self.seg
        extra = (accum_of(s.config) - 1) * self.micro_s
        return s.data_s + s.fwd_s + s.opt_s + s.rest_s + self.calibration_s - extra


@dataclass(frozen=True)
class Prediction:
    config: Config
    step_s: float
    exposed_comm_s: float
    overlap: float
    bwd_s: float
    comm_s: float
    held_bytes: int = 0  # parameters + gradients + optimizer state per rank (metrics.memory.held_by_formula)
    unphysical: str = ""  # why step_s cannot be right ("": it can): shown as "n/a", never as a number


def fit(seg: SegmentData) -> Model:
    """Fit every part from `seg`; the measured configuration is then predicted exactly (calibration_s). Each
    constant is the segment's own where it can tell, else one that holds on its device (constants.py)."""
    alpha = constants.alpha(seg)
    comm = constants.comm_slowdown(seg, fit_comm_slowdown(seg.isolated, seg.world_size, alpha.value))
    links = fit_links(seg.comm, seg.world_size, comm.value, alpha.value)
    if links and links["allreduce"].alpha_fitted:
        alpha = Constant(alpha.name, links["allreduce"].alpha, alpha.unit, f"fitted on segment {seg.segment}'s "
                         "collectives")
    compute, copy = constants.compute_slowdown(seg), constants.copy_cost(seg)
    cpu = None
    if seg.link_bps and links:
        cpu = max(0.0, links["allreduce"].beta - 8.0 / seg.link_bps)
    micro = micro_s(seg.data_s, seg.fwd_s, seg.bwd_s, accum_of(seg.config))
    back = _without_ddp(seg, fit_backward(seg, compute.value), copy.value)
    model = Model(seg, back, links, 0.0, cpu, micro, comm.value, compute.value, copy.value,
                  (compute, comm, copy, alpha))
    base = predict(model, measured_config(seg))
    return replace(model, calibration_s=seg.step_s - base.step_s)


def _without_ddp(seg: SegmentData, back: Backward, copy_s_per_byte: float) -> Backward:
    """The backward pass less DDP's bucket copies, when it was measured under DDP."""
    if seg.config.get("strategy") != "ddp" or back.total <= 0:
        return back
    keep = max(0.0, back.total - copy_s_per_byte * seg.param_bytes) / back.total
    return Backward(back.names, tuple(w * keep for w in back.work))


def measured_config(seg: SegmentData) -> Config:
    c = seg.config
    ddp = c.get("strategy") == "ddp"
    return Config(str(c.get("strategy")), float(c.get("bucket_mb", 25.0)) if ddp else None,
                  bool(c.get("async_op", False)) and c.get("strategy") == "allreduce", accum=accum_of(c),
                  compress=compress_of(c))


def _beta(model: Model, config: Config) -> float | None:
    """β on the asked link: its 8/rate plus the CPU's share of each byte the recording showed."""
    if config.link_bps is None:
        return None
    if model.cpu_s_per_byte is None:
        raise ValueError("the recording's link rate is not known: give it to predict another link")
    return (8.0 / config.link_bps if config.link_bps > 0 else 0.0) + model.cpu_s_per_byte


def _tensors(seg: SegmentData) -> list[int]:
    """Per-parameter tensor bytes in definition order. A layer's parameters are recorded together: its first
    tensor gets the bytes, its others (biases, a fraction of a percent) count for their latency only."""
    each = max(1, round(seg.param_tensors / max(1, len(seg.layers))))
    out: list[int] = []
    for _, count in seg.layers:
        out += [round(count * seg.bytes_per_param)] + [0] * (each - 1)
    return out


def timeline(model: Model, config: Config) -> Timeline:
    seg, back = model.seg, model.backward
    world = config.world_size or seg.world_size
    beta = _beta(model, config)
    if config.strategy == "single" or world <= 1 or not model.links:
        return after_backward(back.total, 0.0)
    if config.strategy == "ddp":
        return _ddp(model, config, world, beta)
    if config.strategy in ZERO:
        return _zero(model, config, world, beta)

    def time(kind: str, nbytes: float) -> float:
        return transfer(model.links[kind], kind, nbytes, world, beta, config.compress, seg.param_shapes,
                        seg.param_bytes)

    tensors = _tensors(seg)
    if config.strategy == "allreduce":
        comm = sum(time("allreduce", b) for b in tensors)
        if config.async_op:
            comm -= ASYNC_SAVES * model.links["allreduce"].alpha * (len(tensors) - 1)
        return after_backward(back.total, comm)
    return after_backward(back.total, sum(time("gather", b) + time("scatter", b) for b in tensors))


def _ddp(model: Model, config: Config, world: int, beta: float | None) -> Timeline:
    seg, back = model.seg, model.backward
    line = model.links["allreduce"]
    buckets = ddp_buckets(seg.layers, seg.bytes_per_param, config.bucket_mb or 25.0)
    position = {name: i for i, name in enumerate(back.names)}
    last = len(back.work) - 1
    # a bucket is ready when its last gradient is: the layer among its own that the backward pass reaches last
    ready = [max(position.get(name, last) for name in b.layers) if b.layers else last for b in buckets]
    comm = [transfer(line, "allreduce", b.nbytes, world, beta, config.compress, seg.param_shapes, seg.param_bytes)
            for b in buckets]
    tl = overlapped(back.work, ready, comm, model.compute_slowdown, model.comm_slowdown)
    return replace(tl, bwd_s=tl.bwd_s + model.copy_s_per_byte * seg.param_bytes)


def _zero(model: Model, config: Config, world: int, beta: float | None) -> Timeline:
    """ZeRO as torch runs it (train/strategies): zero1 is DDP's buckets, then each share's owner broadcasts the
    updated share (every rank receives (N−1)/N·S: priced as a ring all-gather of S, the even shares' case) after the
    optimizer step, exposed. zero2/zero3: per unit (each top-level block) K or 2K all-gathers of (N−1)/N·S_u and one
    reduce-scatter (gloo: an all-reduce, 2(N−1)/N·S_u), all exposed: on a CPU FSDP2 calls them on the training
    thread (tests/ranks/test_zero_timing.py). On a GPU its prefetch can hide some: there this is an upper bound."""
    seg, line = model.seg, model.links["allreduce"]

    def gather(nbytes: float) -> float:
        return line.time("allgather", nbytes, world, beta)

    if config.strategy == "zero1":
        buckets = float(seg.config.get("bucket_mb", 25.0)) if seg.config.get("strategy") in ("ddp", "zero1") else 25.0
        tl = _ddp(model, replace(config, strategy="ddp", bucket_mb=buckets), world, beta)
        broadcast = gather(seg.param_bytes)
        comm = tl.comm_s + broadcast
        return Timeline(tl.bwd_s, comm, tl.exposed_s + broadcast, tl.overlap * tl.comm_s / comm if comm else 0.0)
    scatter = "allreduce" if seg.backend != "nccl" else "allgather"  # NCCL's ring reduce-scatter: (N−1)/N·S
    gathers = (2 if config.strategy == "zero3" else 1) * config.accum
    comm = sum(gathers * gather(b) + line.time(scatter, b, world, beta) for b in seg.units())
    return after_backward(model.backward.total, comm)


def predict(model: Model, config: Config) -> Prediction:
    """One configuration's step: the fixed parts, its K−1 unsynchronized micro-steps, then the last micro-step's
    backward pass and the communication it leaves exposed."""
    check(config.strategy, config.compress, config.accum)
    tl = timeline(model, config)
    step = model.fixed_s + (config.accum - 1) * model.micro_s + tl.bwd_s + tl.exposed_s
    held = sum(held_by_formula(config.strategy, model.seg.param_bytes, config.world_size or model.seg.world_size))
    return Prediction(config, step, tl.exposed_s, tl.overlap, tl.bwd_s, tl.comm_s, held,
                      _unphysical(model, config, step))


def _unphysical(model: Model, config: Config, step_s: float) -> str:
    """Why a predicted step cannot be: not positive, or faster than its own compute alone (forward, the backward pass
    with no transfer beside it and DDP's copies, optimizer, the configuration's micro-steps); "" where it can. The
    calibration (what the measured step holds beyond the model's parts) is negative where a constant does not fit
    the device, and can sink a step below."""
    seg = model.seg
    copy = model.copy_s_per_byte * seg.param_bytes if config.strategy in ("ddp", "zero1") else 0.0  # DDP's buckets
    compute = (seg.fwd_s + seg.opt_s + model.backward.total + copy
               + (config.accum - accum_of(seg.config)) * model.micro_s)
    if step_s <= 0:
        return "n/a: the fit gives a step of no time or less"
    if step_s < compute * (1 - 1e-9):
        return f"n/a: faster than its compute alone ({compute * 1e3:.3g} ms): the fit does not hold here"
    return ""


def grid(seg: SegmentData, buckets_mb: Sequence[float] = BUCKETS_MB, worlds: Sequence[int] = (),
         links_bps: Sequence[float | None] = (None,), settings: Sequence[tuple[int, str]] = ()) -> list[Config]:
    """Every strategy (DDP at each bucket size, allreduce sync and async, ZeRO-1/2/3) at each world size and link, at
    the fitted segment's accum, uncompressed; then the fitted configuration under each (accum, compress) of
    `settings` that it can run (on the recorded world size and link)."""
    out = []
    k = accum_of(seg.config)
    for world in worlds or (seg.world_size,):
        for link in links_bps:
            w = None if world == seg.world_size else world
            out += [Config("ddp", mb, False, w, link, k) for mb in buckets_mb]
            out += [Config("allreduce", None, False, w, link, k), Config("allreduce", None, True, w, link, k),
                    Config("gather-scatter", None, False, w, link, k)]
            out += [Config(z, None, False, w, link, k) for z in ZERO]
    return out + [c for c in _settings(seg, settings) if c not in out]


def _settings(seg: SegmentData, settings: Sequence[tuple[int, str]]) -> list[Config]:
    fitted, out = measured_config(seg), []
    for accum, compress in settings:
        c = replace(fitted, accum=accum, compress=compress)
        try:
            check(c.strategy, c.compress, c.accum)
        except ValueError:  # PowerSGD off DDP, compression on single: not a configuration to offer
            continue
        if c not in out and (seg.param_shapes or not compress.startswith("powersgd")):
            out.append(c)
    return out


def predict_table(seg: SegmentData, configs: Iterable[Config] | None = None) -> list[Prediction]:
    """Fit on `seg` and predict each configuration (default: `grid(seg)`)."""
    model = fit(seg)
    return [predict(model, c) for c in (grid(seg) if configs is None else configs)]
