"""Provides a recording's segment as the what-if model's input (ddptop.metrics.whatif.SegmentData), and the
predictions from it set beside the measured step time of every segment. The assembly and the rows are
ddptop.metrics.whatif's (inputs, rows), which the live screen calls on the session's events too."""

from __future__ import annotations

from typing import Any, Sequence

from ddptop.errors import RecordingError, UsageError
from ddptop.events import RunStarted, StepSpans
from ddptop.metrics.whatif import model as whatif
from ddptop.metrics.whatif.data import SegmentData
from ddptop.metrics.whatif.inputs import PART_FIELDS, NoFit, pick_segment, segment_input
from ddptop.metrics.whatif.rows import (best_row, measured_steps, name, prediction_rows, ran_settings,  # noqa: F401
                                        same_config, versus_rows)
from ddptop.record.reader import Recording


def segment_data(rec: Recording, segment: int | None = None, link_bps: float | None = None,
                 table: list | None = None) -> SegmentData:
    """The segment `segment` (default: the first DDP segment with measured steps, else the first that
    communicates, else segment 0) of `rec`. `table`: rec.segment_figures() where the caller has it."""
    figures = {f.index: f for f in (rec.segment_figures() if table is None else table) if f.measured_steps}
    if not figures:
        raise UsageError(f"{rec.path}: no segment has measured steps to fit the model on")
    segment = pick_segment(list(figures.values())) if segment is None else segment
    if segment not in figures:
        raise UsageError(f"{rec.path}: no segment {segment} with measured steps (segments: "
                         f"{', '.join(str(i) for i in sorted(figures))})")
    run = next((e for e in rec.events(("events",)) if isinstance(e, RunStarted)), None)  # typed: fields checked
    if run is None or not run.layers or run.param_bytes <= 0:
        raise RecordingError(f"{rec.path}: no parameter layout to fit on (the run's run_started event is missing)")
    fig = figures[segment]
    have = {row[1] for row in rec.query("PRAGMA table_info(steps)")}  # files from before micro_s lack it: 0
    fields = [c for c in PART_FIELDS if c in have]
    rows = rec.stream(f"SELECT {', '.join(c if c in have else f'0.0 AS {c}' for c in PART_FIELDS)} FROM steps "
                      f"WHERE segment = ? AND step >= ? AND sampled = 0 AND "
                      f"{' AND '.join(f'{c} IS NOT NULL' for c in fields)}", (segment, fig.first_step + fig.warmup))
    # spans decoded as the reader decodes them (every field checked; a row holding NULL or NaN left out)
    spans = (e for e in rec.events(("spans",)) if isinstance(e, StepSpans))
    try:
        return segment_input(fig, run, rec.world_size, rows, spans, link_bps, list(figures.values()))
    except NoFit as exc:
        raise UsageError(f"{rec.path}: {exc}") from None


def predictions(rec: Recording, segment: int | None = None, link_bps: float | None = None,
                buckets: Sequence[float] = whatif.BUCKETS_MB, worlds: Sequence[int] = (),
                links: Sequence[float | None] = (None,), recorded_link: str | None = None,
                table: list | None = None, settings: Sequence[tuple[int, str]] = ()
                ) -> tuple[SegmentData, list[dict[str, Any]]]:
    """`ddptop advise`'s rows (its --json "predictions"): the model fitted on `segment` (default: the first DDP
    one), every configuration of the grid predicted, each beside the recording's segment of that configuration;
    the fitted configuration also under each (accum, compress) the recording ran and each of `settings`."""
    table = rec.segment_figures() if table is None else table
    seg = segment_data(rec, segment, link_bps, table)
    measured = measured_steps(table)
    ran = ran_settings(seg, measured)
    return seg, prediction_rows(seg, measured, buckets, worlds, links, recorded_link,
                                ran + [p for p in settings if p not in ran])


def best(rec: Recording, segment: int, table: list | None = None) -> dict[str, Any] | None:
    """The configuration predicted fastest from `segment` itself (on its own link and world size), with
    "saving_s": the segment's measured step time (the slowest rank's mean, which the fit reproduces) less the
    prediction. None where the model cannot fit the segment (no sampled collectives, no parameter layout)."""
    try:
        seg, rows = predictions(rec, segment, table=table)
    except (UsageError, RecordingError, ValueError, KeyError):
        return None
    return best_row(rows, seg)


def bests(rec: Recording, table: list | None = None) -> dict[int, dict[str, Any]]:
    """best() of every DDP and allreduce segment with measured steps (the hints' prediction)."""
    table = rec.segment_figures() if table is None else table
    found = {index: best(rec, index, table) for index, cfg, _, _ in measured_steps(table)
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
    found = versus_rows(seg, rows, measured_steps(table))
    return None if found is None else (seg.segment, *found)
