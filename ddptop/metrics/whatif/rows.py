"""Provides the what-if table as rows (`ddptop advise --json`'s "predictions", the What-if panel's table): every
configuration of the grid predicted from one fitted segment, each beside the measured segment of that configuration,
and the predicted-vs-measured comparison (the report's table and figure, the panel's running error)."""

from __future__ import annotations

import math
import statistics
from typing import Any, Sequence

from ddptop.metrics.whatif import model as whatif
from ddptop.metrics.whatif.data import SegmentData


def fitted_constants(seg: SegmentData) -> list[dict[str, Any]]:
    """The constants the fit on `seg` used, each with where it came from (`ddptop advise --json`'s "constants")."""
    return [c.to_dict() for c in whatif.fit(seg).constants]


def measured_steps(table: Sequence) -> list[tuple[int, dict, float, float]]:
    """(segment, config, the slowest rank's mean step time, its standard error) of every segment with measured
    steps."""
    return [(f.index, dict(f.config), f.slowest.step_s, f.slowest.step_se_s) for f in table if f.measured_steps]


def prediction_rows(seg: SegmentData, measured: list[tuple[int, dict, float, float]],
                    buckets: Sequence[float] = whatif.BUCKETS_MB, worlds: Sequence[int] = (),
                    links: Sequence[float | None] = (None,), recorded_link: str | None = None,
                    settings: Sequence[tuple[int, str]] | None = None) -> list[dict[str, Any]]:
    """The model fitted on `seg` (once), every configuration of the grid predicted, each beside `measured`'s
    segment of that configuration (the fitted one first). `settings`: the (accum, compress) pairs to predict for
    the fitted configuration (default: those `measured` ran at the fitted batch size, so each is checked).

    Each row's "step_se_s" is the fitted segment's standard error: the fit reproduces that segment's mean, so a
    mean that step-to-step noise moved by x moves every prediction by x. "measured_step_se_s" is the matched
    segment's own."""
    fitted = whatif.fit(seg)
    settings = ran_settings(seg, measured) if settings is None else settings
    return [_row(whatif.predict(fitted, c), seg, measured, recorded_link)
            for c in whatif.grid(seg, buckets, worlds, links, settings)]


def ran_settings(seg: SegmentData, measured: list[tuple[int, dict, float, float]]) -> list[tuple[int, str]]:
    """Every (accum, compress) a measured segment ran at the fitted segment's batch size, in order."""
    out: list[tuple[int, str]] = []
    for _, cfg, _, _ in measured:
        pair = (whatif.accum_of(cfg), whatif.compress_of(cfg))
        if cfg.get("batch_size") == seg.config.get("batch_size") and pair not in out:
            out.append(pair)
    return out


def _row(p, seg: SegmentData, measured: list[tuple[int, dict, float, float]], recorded_link: str | None
         ) -> dict[str, Any]:
    c = p.config
    world = c.world_size or seg.world_size
    link = recorded_link or None
    if c.link_bps is not None:
        link = "unlimited" if c.link_bps == 0 else _describe(c.link_bps)
    match = None
    if c.world_size is None and c.link_bps is None:
        same = [(i, step, se) for i, cfg, step, se in measured if same_config(cfg, c, seg)]
        match = next((m for m in same if m[0] == seg.segment), same[0] if same else None)  # the fitted one first
    return {"strategy": c.strategy, "bucket_mb": c.bucket_mb, "async_op": c.async_op, "accum": c.accum,
            "compress": c.compress, "world_size": world,
            "link": link, "step_s": None if p.unphysical else round(p.step_s, 6), "n_a": p.unphysical or None,
            "exposed_comm_s": round(p.exposed_comm_s, 6),
            "overlap": round(p.overlap, 4), "held_bytes": p.held_bytes,
            "measured_step_s": None if match is None else round(match[1], 6),
            "segment": None if match is None else match[0], "step_se_s": round(seg.step_se_s, 6),
            "measured_step_se_s": None if match is None else round(match[2], 6)}


def _describe(bps: float) -> str:
    for unit, scale in (("gbit", 1e9), ("mbit", 1e6), ("kbit", 1e3)):
        if bps >= scale:
            return f"{bps / scale:g}{unit}"
    return f"{bps:g}bit"


def same_config(cfg: dict, c: whatif.Config, seg: SegmentData) -> bool:
    """The segment with config `cfg` ran configuration `c` (at the fitted segment's batch size)."""
    if cfg.get("strategy") != c.strategy or cfg.get("batch_size") != seg.config.get("batch_size"):
        return False
    if whatif.accum_of(cfg) != c.accum or whatif.compress_of(cfg) != c.compress:
        return False
    if c.strategy == "ddp":
        return float(cfg.get("bucket_mb", 25.0)) == c.bucket_mb
    return c.strategy != "allreduce" or bool(cfg.get("async_op")) == c.async_op


def name(row: dict) -> str:
    """A prediction row's configuration in words: "ddp 10 MB", "allreduce async"."""
    text = row["strategy"] + (f" {row['bucket_mb']:g} MB" if row["bucket_mb"] is not None else "")
    text += " async" if row["async_op"] else ""
    text += f" accum {row['accum']}" if row.get("accum", 1) != 1 else ""
    return text + (f" {row['compress']}" if row.get("compress", "none") != "none" else "")


def config_name(cfg: dict) -> str:
    """A segment's configuration (its config mapping) in the rows' words."""
    ddp = cfg.get("strategy") == "ddp"
    return name({"strategy": str(cfg.get("strategy")), "bucket_mb": float(cfg.get("bucket_mb", 25.0)) if ddp else None,
                 "async_op": bool(cfg.get("async_op")) and cfg.get("strategy") == "allreduce",
                 "accum": whatif.accum_of(cfg), "compress": whatif.compress_of(cfg)})


def row_for(rows: list[dict[str, Any]], cfg: dict, seg: SegmentData) -> dict[str, Any] | None:
    """The row predicting the configuration a segment ran with `cfg` (on the fitted run's own world and link)."""
    return next((r for r in rows if r["world_size"] == seg.world_size and r["link"] is None
                 and same_config(cfg, whatif.Config(r["strategy"], r["bucket_mb"], r["async_op"],
                                                    accum=r["accum"], compress=r["compress"]), seg)), None)


def same_step(row: dict[str, Any], seg: SegmentData) -> bool:
    """The row trains as many samples a step as the fitted segment (the same accum)."""
    return row.get("accum", 1) == whatif.accum_of(seg.config)


def ranked_s(row: dict[str, Any]) -> float:
    """A row's step time by the best evidence the job has: its measurement where a segment ran that configuration
    (the prediction is then only a guess beside it: issue 44's "ddp 1 MB, −33 ms/step" measured 9 ms slower),
    else its prediction; a prediction that cannot be (step_s None: "n_a" says why) ranks last."""
    measured = row.get("measured_step_s")
    if measured is None:
        return math.inf if row["step_s"] is None else row["step_s"]
    return measured


def best_row(rows: list[dict[str, Any]], seg: SegmentData) -> dict[str, Any]:
    """The fastest configuration on the fitted segment's own world size and link, each ranked by `ranked_s` (its
    measurement where this job ran it, else its prediction), with "saving_s" against the segment's measured step
    time, "by" ("measured" or "predicted"), "noise_s" (one standard error of that saving: the fitted segment's,
    which a prediction inherits, and a measured segment's own beside it) and "verdict": "in force" (no other is
    faster), "noise" (faster by no more than noise_s: no better within noise) or "faster". Only rows at the
    segment's own accum compete: a step of K micro-steps trains K times the samples, so its s/step is not the same
    race."""
    own = [r for r in rows if r["world_size"] == seg.world_size and same_step(r, seg)] or rows
    top = min(own, key=ranked_s)
    fitted = row_for(own, seg.config, seg)
    # a tie (a model smaller than every bucket: 1 MB and 25 MB alike), or none faster than the segment's measured
    # step, names the configuration in force, not the first row
    if fitted is not None and (ranked_s(fitted) <= ranked_s(top) * (1 + 1e-6) or ranked_s(top) >= seg.step_s):
        top = fitted
    measured = top.get("measured_step_s") is not None
    saving = seg.step_s - ranked_s(top)
    noise = math.hypot(seg.step_se_s, top.get("measured_step_se_s") or 0.0) if measured else seg.step_se_s
    in_force = top is fitted or saving <= 0
    return {**top, "from_segment": seg.segment, "fitted_step_s": seg.step_s, "saving_s": saving,
            "by": "measured" if measured else "predicted", "noise_s": noise,
            "verdict": "in force" if in_force else "noise" if saving <= noise else "faster"}


def recommended(best: dict[str, Any] | None) -> bool:
    """A best_row worth switching to: faster than the configuration in force by more than its noise."""
    return best is not None and best.get("verdict") == "faster"


def error_se(fitted_se_s: float, measured_se_s: float, measured_s: float) -> float:
    """The standard error of (predicted − measured)/measured from the two segments' step-to-step noise alone (the
    fitted segment's passes into the prediction, the other's is the truth's): how far apart two means of one
    configuration would land by chance. 0 where neither says."""
    return math.hypot(fitted_se_s, measured_se_s) / measured_s if measured_s > 0 else 0.0


def versus_rows(seg: SegmentData, rows: list[dict[str, Any]], measured: list[tuple[int, dict, float, float]]
                ) -> tuple[list[dict[str, Any]], float, float] | None:
    """Every measured segment but the fitted one that ran a predicted configuration, beside its prediction:
    (rows with "error" = (predicted − measured)/measured and "error_se", that error's standard error from both
    segments' step-to-step noise, median |error|, max |error|); None where there is none."""
    out = []
    for index, cfg, step_s, se in measured:
        row = row_for(rows, cfg, seg) if index != seg.segment else None
        if row is not None and row["step_s"] is not None and step_s > 0:
            out.append({**row, "segment": index, "measured_step_s": step_s, "measured_step_se_s": se,
                        "error": (row["step_s"] - step_s) / step_s, "error_se": error_se(seg.step_se_s, se, step_s)})
    if not out:
        return None
    errors = [abs(r["error"]) for r in out]
    return out, statistics.median(errors), max(errors)
