"""Provides the what-if model's input (SegmentData) from one segment's events: its steps, its sampled spans and its
row of the segment table. `ddptop advise` reads them from a recording (ddptop.record.whatif), the live screen from
the session state (ddptop.state.advising): both call `segment_input`, so one segment gives one fit."""

from __future__ import annotations

import math
from typing import Iterable, Sequence

from ddptop.metrics.whatif.compute import layer_times
from ddptop.metrics.whatif.data import CommSample, SegmentData
from ddptop.metrics.whatif.settings import accum_of, compress_of

_KINDS = {"bucket": "allreduce", "allreduce": "allreduce", "gather": "gather", "scatter": "scatter",
          "broadcast": "broadcast"}
# a step's parts as the steps table holds them (StepDone's fields of the same names)
# (micro_s last: a file from before it reads 0 there, ddptop.record.whatif)
PART_FIELDS = ("iter_s", "data_s", "fwd_s", "bwd_s", "opt_s", "own_s", "comm_s", "exposed_comm_s", "compute_s",
               "micro_s")


class NoFit(ValueError):
    """The segment cannot be fitted (the reason in words, without the file's name)."""


def step_row(step) -> tuple[float, ...]:
    """A StepDone as a row of PART_FIELDS (what `parts` averages)."""
    return tuple(float(getattr(step, f)) for f in PART_FIELDS)


def parts(rows: Iterable[Sequence[float]]) -> dict[str, float]:
    """Means of the measured steps' parts; `rest_s` is ddptop's own time plus `other` (the step less its parts).
    Rows holding a non-finite number are left out, as the reader leaves them out everywhere (NaN reads as NULL).
    `fwd_s` holds the K−1 unsynchronized micro-steps too (StepDone.micro_s, where they run: the forward's interval),
    as settings.micro_s divides data + forward + backward by accum; files from before micro_s hold them there."""
    sums, n = [0.0] * 8, 0
    for row in rows:
        it, data, fwd, bwd, opt, own, comm, exposed, compute, micro = row
        if not all(isinstance(v, (int, float)) and math.isfinite(v) for v in row):
            continue
        other = max(0.0, it - data - compute - exposed - own)
        for i, v in enumerate((data, fwd + micro, bwd, opt, own, comm, exposed, other)):
            sums[i] += v
        n += 1
    data, fwd, bwd, opt, own, comm, exposed, other = (s / n if n else 0.0 for s in sums)
    return {"data_s": data, "fwd_s": fwd, "bwd_s": bwd, "opt_s": opt, "rest_s": own + other, "comm_s": comm,
            "exposed_comm_s": exposed}


def uncompressed(config) -> bool:
    return compress_of(config) == "none"


def pick_segment(table: Sequence) -> int | None:
    """advise's default segment: the first uncompressed DDP segment with measured steps (one without accumulation
    first), else the first uncompressed one that communicates, else the first with measured steps (None: no
    segment has any). A compressed segment cannot be fitted (segment_input)."""
    figures = sorted((f.index, f.config.get("strategy"), f.config) for f in table if f.measured_steps)
    plain = [(i, s, c) for i, s, c in figures if uncompressed(c)]
    ddp = [i for i, s, c in plain if s == "ddp" and accum_of(c) == 1]
    ddp += [i for i, s, _ in plain if s == "ddp"]
    talks = [i for i, s, _ in plain if s != "single"]
    return (ddp or talks or [i for i, _, _ in figures] or [None])[0]


def segment_input(fig, run, world_size: int, rows: Iterable[Sequence[float]], spans: Iterable,
                  link_bps: float | None = None, table: Sequence = ()) -> SegmentData:
    """SegmentData of segment `fig` (a metrics.SegmentFigures with measured steps): `run` the RunStarted (its
    parameter layout), `rows` its steps as step_row tuples (any; those before the warm-up and sampled ones are the
    caller's to leave out), `spans` StepSpans (any segment: this one's after the warm-up are used; another's
    per-parameter all_reduces, where `table` names its segment, fit the collectives' latency: `latency`)."""
    spans = list(spans)
    if not uncompressed(fig.config):
        raise NoFit(f"segment {fig.index} ran compress={fig.config.get('compress')}: its collectives' times hold "
                    "the compression's own work, so the link cannot be fitted on them: pick an uncompressed --segment")
    first = fig.first_step + fig.warmup
    alpha = latency(spans, [f for f in table if f.index < fig.index], world_size)
    spans = [e for e in spans if e.segment == fig.index]
    is_async = bool(fig.config.get("async_op")) and fig.config.get("strategy") == "allreduce"
    backward, comm, isolated = samples(spans, first, is_async)
    if not backward:  # a sweep's warm-up can hold a segment's only sampled step: any but its very first will do
        backward, comm, isolated = samples(spans, fig.first_step + 1, is_async)
    if fig.config.get("strategy") in ("zero2", "zero3") and world_size > 1:
        raise NoFit(f"segment {fig.index} ran {fig.config.get('strategy')}: FSDP2's collectives run inside its forward "
                    "and backward passes, so its backward cannot be told from them: pick a ddp or allreduce --segment "
                    "(its what-if table has rows for zero1, zero2 and zero3)")
    if not comm and world_size > 1:
        raise NoFit(f"segment {fig.index} has no sampled collectives to fit the link on "
                    f"({fig.config.get('strategy')}; spans are recorded every --span-every steps): "
                    "pick another --segment")
    return SegmentData(segment=fig.index, config=dict(fig.config), world_size=world_size, layers=run.layers,
                       param_bytes=run.param_bytes, param_tensors=run.param_tensors or len(run.layers),
                       step_s=fig.slowest.step_s, step_se_s=fig.slowest.step_se_s, backward=backward, comm=comm,
                       link_bps=link_bps,
                       param_shapes=tuple(tuple(s) for s in getattr(run, "param_shapes", ()) or ()),
                       isolated=isolated, backend=getattr(run, "backend", "") or "", latency=alpha,
                       **parts(rows))


def latency(spans: Sequence, table: Sequence, world_size: int) -> tuple[int, float] | None:
    """(segment, α) fitted on the newest segment of `table` (the caller passes those before the fitted one, all the
    live screen had when it fitted that one: one segment, one fit) that ran per-parameter all_reduce synchronously: its
    tensors' sizes spread over orders of magnitude, so the line separates α from β (link.fit_line), which one DDP
    segment's pooled buckets cannot. None where no such segment has sampled spans."""
    from ddptop.metrics.whatif.link import fit_line

    sync = [f for f in table if f.measured_steps and f.config.get("strategy") == "allreduce"
            and not f.config.get("async_op") and uncompressed(f.config) and accum_of(f.config) == 1]
    for f in sorted(sync, key=lambda f: -f.index):
        own = [e for e in spans if e.segment == f.index]
        _, comm, _ = samples(own, f.first_step + f.warmup, False)
        if not comm:  # a sweep's warm-up can hold its only sampled step (segment_input)
            _, comm, _ = samples(own, f.first_step + 1, False)
        line = fit_line("allreduce", [c for c in comm if c.kind == "allreduce"], world_size)
        if line is not None and line.alpha_fitted:
            return f.index, line.alpha
    return None


def samples(spans: Iterable, first: int, is_async: bool) -> tuple[tuple, tuple[CommSample, ...],
                                                                   tuple[CommSample, ...]]:
    """Backward layers per (rank, sampled step) from `first` on, each collective pooled over ranks, and the DDP
    buckets that ran with no other bucket beside them on any rank, each pooled over ranks (`_isolated`)."""
    backward = []
    collectives: dict[tuple[int, str], list[tuple[int, float, float, int, list]]] = {}
    alone: dict[tuple[int, str], list[tuple[int, float, float, int, list] | None]] = {}
    for e in spans:
        if e.step < first:
            continue
        bwd = [(s.name, s.start_s, s.end_s) for s in e.spans if s.kind == "bwd"]
        talk = [(s.name, s.start_s, s.end_s, s.nbytes) for s in e.spans if s.kind == "comm"]
        if not is_async:
            for name, a, b, nbytes, by_itself in _isolated(talk):
                alone.setdefault((e.step, name), []).append((e.rank, a, b, nbytes, bwd) if by_itself else None)
        talk = _as_one(talk, "allreduce " if is_async else "bucket ")
        backward.append(layer_times(bwd, [(a, b) for _, a, b, _ in talk]))
        for name, a, b, nbytes in talk:
            collectives.setdefault((e.step, name), []).append((e.rank, a, b, nbytes, bwd))
    isolated = tuple(_pooled(name, seen) for (_, name), seen in alone.items()
                     if len(seen) > 1 and all(s is not None for s in seen))
    return tuple(backward), tuple(_pooled(name, seen) for (_, name), seen in collectives.items()
                                  if name.split(" ")[0] in _KINDS), isolated


def _isolated(talk: list[tuple[str, float, float, int]]) -> list[tuple[str, float, float, int, bool]]:
    """One rank's DDP buckets of one step, each with whether no other bucket's span met its own."""
    buckets = [t for t in talk if t[0].startswith("bucket ")]
    return [(n, a, b, nbytes, not any(m != n and a2 < b and a < b2 for m, a2, b2, _ in buckets))
            for n, a, b, nbytes in buckets]


def _as_one(talk: list[tuple[str, float, float, int]], prefix: str) -> list[tuple[str, float, float, int]]:
    """DDP's buckets (or async all_reduces) of one step as one all-reduce of all their bytes over the time any of
    them was in flight: gloo runs several at once (2 threads per process group), so one span holds others' transfers."""
    buckets = sorted((t for t in talk if t[0].startswith(prefix)), key=lambda t: t[1])
    if not buckets:
        return talk
    busy, end = 0.0, -1e300
    for _, a, b, _ in buckets:
        busy += max(0.0, b - max(a, end))
        end = max(end, b)
    first = buckets[0][1]
    # one interval from the first launch, as long as the union: its overlap with the backward pass is then the
    # time the buckets ran beside it (they start inside it and run on after it)
    rest = [t for t in talk if not t[0].startswith(prefix)]
    return rest + [("bucket all", first, first + busy, sum(t[3] for t in buckets))]


def _pooled(name: str, seen: list[tuple[int, float, float, int, list]]) -> CommSample:
    """A ring's rank that arrived last waited for nobody: its span (the shortest) is the transfer. A gather's or
    scatter's is the root's: the others leave once their own share has moved."""
    root = [s for s in seen if s[0] == 0] if name.split(" ")[0] in ("gather", "scatter") else []
    _, a, b, nbytes, bwd = root[0] if root else min(seen, key=lambda s: s[2] - s[1])
    overlap = sum(max(0.0, min(b, e) - max(a, s)) for _, s, e in bwd)
    return CommSample(_KINDS[name.split(" ")[0]], nbytes, b - a, min(overlap, b - a))
