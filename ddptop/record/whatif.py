"""Provides a recording's segment as the what-if model's input (ddptop.metrics.whatif.SegmentData), and the
measured step time of every segment to set beside the predictions."""

from __future__ import annotations

import statistics
from typing import Any, Sequence

from ddptop.errors import RecordingError, UsageError
from ddptop.events import RunStarted, StepSpans
from ddptop.metrics.whatif.compute import layer_times
from ddptop.metrics.whatif import model as whatif
from ddptop.metrics.whatif.data import CommSample, SegmentData
from ddptop.record.reader import Recording

_KINDS = {"bucket": "allreduce", "allreduce": "allreduce", "gather": "gather", "scatter": "scatter",
          "broadcast": "broadcast"}


def segment_data(rec: Recording, segment: int | None = None, link_bps: float | None = None,
                 table: list | None = None) -> SegmentData:
    """The segment `segment` (default: the first DDP segment with sampled steps, else segment 0) of `rec`.
    `table`: rec.segment_figures() where the caller has it (one pass over the steps, not one per call)."""
    figures = {f.index: f for f in (rec.segment_figures() if table is None else table) if f.measured_steps}
    if not figures:
        raise UsageError(f"{rec.path}: no segment has measured steps to fit the model on")
    if segment is None:  # the first DDP segment, else the first that communicates
        ddp = [i for i, f in sorted(figures.items()) if f.config.get("strategy") == "ddp"]
        talks = [i for i, f in sorted(figures.items()) if f.config.get("strategy") != "single"]
        segment = (ddp or talks or sorted(figures))[0]
    if segment not in figures:
        raise UsageError(f"{rec.path}: no segment {segment} with measured steps (segments: "
                         f"{', '.join(str(i) for i in sorted(figures))})")
    run = next((e for e in rec.events(("events",)) if isinstance(e, RunStarted)), None)  # typed: fields checked
    if run is None or not run.layers or run.param_bytes <= 0:
        raise RecordingError(f"{rec.path}: no parameter layout to fit on (the run's run_started event is missing)")
    fig = figures[segment]
    parts = _parts(rec, segment, fig.first_step + fig.warmup)
    is_async = bool(fig.config.get("async_op")) and fig.config.get("strategy") == "allreduce"
    backward, comm = _samples(rec, segment, fig.first_step + fig.warmup, is_async)
    if not backward:  # a sweep's warm-up can hold a segment's only sampled step: any but its very first will do
        backward, comm = _samples(rec, segment, fig.first_step + 1, is_async)
    if not comm and rec.world_size > 1:
        raise UsageError(f"{rec.path}: segment {segment} has no sampled collectives to fit the link on "
                         f"({fig.config.get('strategy')}; spans are recorded every --span-every steps): "
                         "pick another --segment")
    return SegmentData(segment=segment, config=dict(fig.config), world_size=rec.world_size, layers=run.layers,
                       param_bytes=run.param_bytes, param_tensors=run.param_tensors or len(run.layers),
                       step_s=fig.slowest.step_s, backward=backward, comm=comm, link_bps=link_bps, **parts)


def _parts(rec: Recording, segment: int, first: int) -> dict[str, float]:
    # rows holding an infinite number are left out, as the reader leaves them out everywhere (NaN reads as NULL)
    finite = " AND ".join(f"abs({c}) < 1e300" for c in ("iter_s", "data_s", "fwd_s", "bwd_s", "opt_s", "own_s",
                                                          "comm_s", "exposed_comm_s", "compute_s"))
    row = rec.query("SELECT avg(data_s), avg(fwd_s), avg(bwd_s), avg(opt_s), avg(own_s), avg(comm_s), "
                    "avg(exposed_comm_s), avg(max(0, iter_s - data_s - compute_s - exposed_comm_s - own_s)) "
                    f"FROM steps WHERE segment = ? AND step >= ? AND sampled = 0 AND {finite}", (segment, first))[0]
    data, fwd, bwd, opt, own, comm, exposed, other = (float(v or 0.0) for v in row)
    return {"data_s": data, "fwd_s": fwd, "bwd_s": bwd, "opt_s": opt, "rest_s": own + other, "comm_s": comm,
            "exposed_comm_s": exposed}


def _samples(rec: Recording, segment: int, first: int, is_async: bool) -> tuple[tuple, tuple[CommSample, ...]]:
    """Backward layers per (rank, sampled step), and each collective pooled over ranks. Spans are read as the
    reader decodes them (every field checked; a row holding NULL or NaN left out, as everywhere else)."""
    backward = []
    collectives: dict[tuple[int, str], list[tuple[int, float, float, int, list]]] = {}
    for e in rec.events(("spans",)):
        if not isinstance(e, StepSpans) or e.segment != segment or e.step < first:
            continue
        bwd = [(s.name, s.start_s, s.end_s) for s in e.spans if s.kind == "bwd"]
        talk = [(s.name, s.start_s, s.end_s, s.nbytes) for s in e.spans if s.kind == "comm"]
        talk = _as_one(talk, "allreduce " if is_async else "bucket ")
        backward.append(layer_times(bwd, [(a, b) for _, a, b, _ in talk]))
        for name, a, b, nbytes in talk:
            collectives.setdefault((e.step, name), []).append((e.rank, a, b, nbytes, bwd))
    return tuple(backward), tuple(_pooled(name, seen) for (_, name), seen in collectives.items()
                                  if name.split(" ")[0] in _KINDS)


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


def measured_steps(rec: Recording, table: list | None = None) -> list[tuple[int, dict, float]]:
    """(segment, config, the slowest rank's mean step time) of every segment with measured steps."""
    table = rec.segment_figures() if table is None else table
    return [(f.index, dict(f.config), f.slowest.step_s) for f in table if f.measured_steps]




def predictions(rec: Recording, segment: int | None = None, link_bps: float | None = None,
                buckets: Sequence[float] = whatif.BUCKETS_MB, worlds: Sequence[int] = (),
                links: Sequence[float | None] = (None,), recorded_link: str | None = None,
                table: list | None = None) -> tuple[SegmentData, list[dict[str, Any]]]:
    """`ddptop advise`'s rows (its --json "predictions"): the model fitted on `segment` (default: the first DDP
    one), every configuration of the grid predicted, each beside the recording's segment of that configuration."""
    table = rec.segment_figures() if table is None else table
    seg = segment_data(rec, segment, link_bps, table)
    fitted = whatif.fit(seg)
    measured = measured_steps(rec, table)
    return seg, [_row(whatif.predict(fitted, c), seg, measured, recorded_link)
                 for c in whatif.grid(seg, buckets, worlds, links)]


def _row(p, seg: SegmentData, measured: list[tuple[int, dict, float]], recorded_link: str | None) -> dict[str, Any]:
    c = p.config
    world = c.world_size or seg.world_size
    link = recorded_link or None
    if c.link_bps is not None:
        link = "unlimited" if c.link_bps == 0 else _describe(c.link_bps)
    match = None
    if c.world_size is None and c.link_bps is None:
        same = [(i, step) for i, cfg, step in measured if same_config(cfg, c, seg)]
        match = next((m for m in same if m[0] == seg.segment), same[0] if same else None)  # the fitted one first
    return {"strategy": c.strategy, "bucket_mb": c.bucket_mb, "async_op": c.async_op, "world_size": world,
            "link": link, "step_s": round(p.step_s, 6), "exposed_comm_s": round(p.exposed_comm_s, 6),
            "overlap": round(p.overlap, 4), "measured_step_s": None if match is None else round(match[1], 6),
            "segment": None if match is None else match[0]}


def _describe(bps: float) -> str:
    for unit, scale in (("gbit", 1e9), ("mbit", 1e6), ("kbit", 1e3)):
        if bps >= scale:
            return f"{bps / scale:g}{unit}"
    return f"{bps:g}bit"


def same_config(cfg: dict, c: whatif.Config, seg: SegmentData) -> bool:
    """The recording's segment ran configuration `c` (at the fitted segment's batch size)."""
    if cfg.get("strategy") != c.strategy or cfg.get("batch_size") != seg.config.get("batch_size"):
        return False
    if c.strategy == "ddp":
        return float(cfg.get("bucket_mb", 25.0)) == c.bucket_mb
    return c.strategy != "allreduce" or bool(cfg.get("async_op")) == c.async_op


def name(row: dict) -> str:
    """A prediction row's configuration in words: "ddp 10 MB", "allreduce async"."""
    text = row["strategy"] + (f" {row['bucket_mb']:g} MB" if row["bucket_mb"] is not None else "")
    return text + (" async" if row["async_op"] else "")


def best(rec: Recording, segment: int, table: list | None = None) -> dict[str, Any] | None:
    """The configuration predicted fastest from `segment` itself (on its own link and world size), with
    "saving_s": the segment's measured step time (the slowest rank's mean, which the fit reproduces) less the
    prediction. None where the model cannot fit the segment (no sampled collectives, no parameter layout)."""
    try:
        seg, rows = predictions(rec, segment, table=table)
    except (UsageError, RecordingError, ValueError, KeyError):
        return None
    top = min(rows, key=lambda r: r["step_s"])
    return {**top, "from_segment": seg.segment, "fitted_step_s": seg.step_s, "saving_s": seg.step_s - top["step_s"]}


def bests(rec: Recording, table: list | None = None) -> dict[int, dict[str, Any]]:
    """best() of every DDP and allreduce segment with measured steps (the hints' prediction)."""
    table = rec.segment_figures() if table is None else table
    found = {index: best(rec, index, table) for index, cfg, _ in measured_steps(rec, table)
             if cfg.get("strategy") in ("ddp", "allreduce")}
    return {index: b for index, b in found.items() if b is not None}


def versus(rec: Recording, table: list | None = None) -> tuple[int, list[dict[str, Any]], float, float] | None:
    """Predicted vs measured: the model fitted on advise's default segment, each other segment of a predicted
    configuration beside its prediction. (fitted segment, rows, median |error|, max |error|); None where the
    model cannot fit or no other segment ran a predicted configuration."""
    try:
        table = rec.segment_figures() if table is None else table
        seg, rows = predictions(rec, table=table)
    except (UsageError, RecordingError, ValueError, KeyError):
        return None
    out = []
    for index, cfg, step_s in measured_steps(rec, table):
        row = next((r for r in rows if index != seg.segment and _as_config(r, cfg, seg)), None)
        if row is not None and step_s > 0:
            out.append({**row, "segment": index, "measured_step_s": step_s,
                        "error": (row["step_s"] - step_s) / step_s})
    if not out:
        return None
    errors = [abs(r["error"]) for r in out]
    return seg.segment, out, statistics.median(errors), max(errors)


def _as_config(row: dict, cfg: dict, seg: SegmentData) -> bool:
    c = whatif.Config(row["strategy"], row["bucket_mb"], row["async_op"])
    return row["world_size"] == seg.world_size and row["link"] is None and same_config(cfg, c, seg)
