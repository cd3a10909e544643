"""A recording's hints per segment (ddptop.metrics.hints over the report's statistics) and the page's Hints section."""

from __future__ import annotations

import math

from ddptop import metrics
from ddptop.events import RunStarted
from ddptop.metrics import hints as rules
from ddptop.metrics.buckets import ddp_buckets
from ddptop.metrics.whatif.rows import recommended
from ddptop.record import whatif
from ddptop.report import markdown
from ddptop.report.analysis import SegmentStats, segment_stats
from ddptop.report.runs import RunData


def link_rate(link: dict) -> tuple[float | None, str]:
    """(bytes/s each way, where it came from) from a recording's meta "link"; (None, "") when absent or not a rate."""
    bits = link.get("bits_per_s") if isinstance(link, dict) else None
    if not isinstance(bits, (int, float)) or isinstance(bits, bool) or not math.isfinite(bits) or bits <= 0:
        return None, ""
    return bits / 8, f"the lab's link, {bits / 1e6:g} Mbit/s"


def for_recording(rec, table: list | None = None) -> list[tuple[SegmentStats, list[rules.Hint]]]:
    """Every segment's hints for `ddptop info`: the report's statistics of an open Recording, without the rest of
    a report (figures, time series, the file's checksum). `table`: rec.segment_figures() where the caller has it."""
    events = list(rec.events(tables=("events", "system")))
    meta = rec.meta
    buckets = meta.get("ddp_buckets") if isinstance(meta.get("ddp_buckets"), dict) else {}
    stats = segment_stats(events, warmup=metrics.warmup_for(rec.config), run_config=rec.config, buckets=buckets,
                          steps=rec.step_events())
    started = next((e for e in events if isinstance(e, RunStarted)), None)
    run = RunData(path=rec.path, label="", sha256="", size_bytes=0, model="", dataset="", world_size=0, warmup=0,
                  start=0.0, duration=0.0, segments=stats, points=[], samples=[], evals=[], provenance={},
                  param_bytes=started.param_bytes if started else 0, layers=started.layers if started else (),
                  link=meta.get("link") if isinstance(meta.get("link"), dict) else {}, predicted=whatif.bests(rec, table))
    return of_run(run, stats)


def inputs(s: SegmentStats, run: RunData) -> rules.Inputs:
    """One segment's numbers as the report measured them: NIC bytes per rank where every rank has its own
    interface (else the formulas), DDP's recorded buckets (else the layout from the layer sizes)."""
    nic = bool(s.ranks) and all(r.nic_sent_mb is not None for r in s.ranks)
    moved = {r.rank: ((r.nic_sent_mb, r.nic_recv_mb) if nic else (r.sent_mb, r.recv_mb)) for r in s.ranks}
    buckets, by = tuple(round(mb * 1e6) for mb in s.buckets_mb), "recorded"
    if not buckets and run.layers and s.config.strategy == "ddp":
        count = sum(n for _, n in run.layers)
        per_param = run.param_bytes / count if count else 4.0
        buckets, by = tuple(b.nbytes for b in ddp_buckets(run.layers, per_param, s.config.bucket_mb)), "layout"
    rate, rate_by = link_rate(run.link)
    best = run.predicted.get(s.index)
    return rules.Inputs(
        strategy=s.config.strategy, bucket_mb=s.config.bucket_mb, world_size=s.world_size,
        step_s=s.mean_rank_step_s, data_s=s.parts.get("data", 0.0), comm_s=s.comm_s, exposed_comm_s=s.exposed_comm_s,
        moved={r: (a * 1e6, b * 1e6) for r, (a, b) in moved.items()}, moved_by="NIC" if nic else "formula",
        formula={r.rank: (r.sent_mb * 1e6, r.recv_mb * 1e6) for r in s.ranks},
        least_comm_s=min((r.comm_s for r in s.ranks), default=0.0),
        gradient_bytes=s.param_bytes, buckets=buckets, buckets_by=by, link_bytes_per_s=rate, link_by=rate_by,
        accum=s.config.accum,
        predicted=None if not recommended(best) else (whatif.name(best), best["saving_s"], (
            f"measured in segment {best['segment']}" if best["by"] == "measured" else "predicted")))


def of_run(run: RunData, shown: list[SegmentStats]) -> list[tuple[SegmentStats, list[rules.Hint]]]:
    return [(s, rules.hints(inputs(s, run))) for s in shown]


def blocks(runs: list[RunData], shown: list[list[SegmentStats]]) -> list[tuple]:
    """The page's Hints section: per segment, each hint with its numbers' source; the rules once."""
    items = []
    for run, segs in zip(runs, shown):
        for s, found in of_run(run, segs):
            name = markdown.segment_name(s)
            if not found:
                items.append(f"segment {name} ({s.config.describe()}): no hint")
            items += [f"segment {name} ({s.config.describe()}): {h.line()}" for h in found]
    rules_text = "; ".join(f"*{name}*: {rule}" for name, rule in rules.RULES.items())
    return [("h2", "Hints"), ("list", items),
            ("p", f"Each hint fires only when its segment clears its rule's margin (ddptop.metrics.hints): "
                  f"{rules_text}.")]
