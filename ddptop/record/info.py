"""`ddptop info`: what ran, where, how long, and each segment with its config and mean step time."""

from __future__ import annotations

import dataclasses
import datetime
import os
import sys
from typing import Any

from ddptop.metrics import rate_unit, table_rows, tables
from ddptop.metrics.cost import front_per_step
from ddptop.metrics.energy import RankEnergy, energies, lines as energy_lines
from ddptop.metrics.memory import memory_table
from ddptop.metrics.stragglers import Stragglers, analyse
from ddptop.events import FrontCost, LogLine, ModelsDiverged, RankShifted, RunFinished
from ddptop.record.reader import WHOLE_STEP, Recording, damaged
from ddptop.safe import clean


def check_integrity(rec: Recording) -> None:
    """SQLite's own page-level check: finds damage that no query of ours happens to touch."""
    rows = rec.query("PRAGMA quick_check(1)")
    if not rows or rows[0][0] != "ok":
        raise damaged(rec.path, ValueError(str(rows[0][0]) if rows else "integrity check returned nothing"))


def summary(rec: Recording, table: list | None = None) -> dict[str, Any]:
    """What `ddptop info` says of a recording. `table`: rec.segment_figures() where the caller has it (one pass
    over the steps: info shares it with the hints' what-if predictions)."""
    config = rec.config
    model = _dict(rec.meta.get("model"))
    ranks = rec.meta.get("ranks") if isinstance(rec.meta.get("ranks"), dict) else {}
    kinds = dict(rec.query("SELECT kind, count(*) FROM events GROUP BY kind"))
    notable = [e for (blob,) in rec.query("SELECT data FROM events WHERE kind IN ('run_finished', 'log', "
                                          "'models_diverged', 'rank_shifted') ORDER BY seq")
               for e in [_decode(rec, blob)]]
    errors = [e for e in notable if (isinstance(e, RunFinished) and e.reason.startswith("error"))
              or (isinstance(e, LogLine) and e.level == "error")]
    gone = lost_ranks(rec)
    incomplete = verdict(rec, gone)
    return {
        "file": rec.path, "size_bytes": os.path.getsize(rec.path), "schema_version": rec.schema_version,
        "complete": not incomplete, "incomplete": incomplete, "model": model.get("model", config.get("model", "?")),
        "dataset": model.get("dataset", config.get("dataset", "?")), "params": model.get("param_count"),
        "tensors": model.get("param_tensors"), "layers": model.get("layers", []), "world_size": rec.world_size,
        "profile": config.get("profile", ""), "ranks": ranks, "hosts": _strings(rec.meta.get("hosts")),
        "versions": _dict(rec.meta.get("versions")), "created": rec.meta.get("created"), "start": rec.start,
        "duration_s": rec.duration, "first_step": rec.first_step, "last_step": rec.last_step,
        "counts": {table: rec.count(table) for table in ("steps", "spans", "system", "events", "memory")},
        "memory": [dataclasses.asdict(m) for m in memory_table(rec.memory_events())],
        "segments": segment_stats(rec, table), "switches": max(0, len(rec.segments()) - 1),
        "ranks_lost": kinds.get("rank_lost", 0), "ranks_back": kinds.get("rank_back", 0),
        "errors": [_error_text(e) for e in errors],
        "finished": _finished([e for e in notable if isinstance(e, RunFinished)]),
        "warnings": [e.describe() for e in notable if isinstance(e, ModelsDiverged)],
        "shifts": [e.describe() for e in notable if isinstance(e, RankShifted)],
        "stragglers": stragglers(rec)[None].describe() if rec.world_size > 1 else "",
        **energy(rec), "front": front(rec),
    }


def front(rec: Recording) -> dict[str, Any]:
    """The front process's CPU time per job step over the whole run (metrics.cost), from its FrontCost readings."""
    readings = [e for (blob,) in rec.query("SELECT data FROM events WHERE kind = 'front_cost' ORDER BY seq")
                for e in [_decode(rec, blob)] if isinstance(e, FrontCost)]
    per_step, steps = front_per_step(readings)
    return {"cpu_s_per_step": per_step, "steps": steps, "readings": len(readings)}


def energy(rec: Recording) -> dict[str, Any]:
    """Each rank's joules per step and sample (metrics.energy), and why there are none: the steps are read again
    only where a sample holds a GPU."""
    gpu = rec.query("SELECT 1 FROM system WHERE gpus != '[]' LIMIT 1")
    status = rec.query("SELECT gpu_status FROM system WHERE gpus = '[]' LIMIT 1")
    if not gpu:
        return {"energy": {}, "energy_why": f"no GPU reading ({clean(status[0][0]) if status else 'none recorded'})"}
    found, why = energies(rec.events(("steps", "system")))
    return {"energy": {str(r): dataclasses.asdict(e) for r, e in found.items()}, "energy_why": why}


def stragglers(rec: Recording) -> dict[int | None, Stragglers]:
    """The straggler verdict of the whole run (key None) and of each segment (metrics.stragglers), from the sampled
    steps' comm spans and rank 0's clock ping-pongs (older recordings have none: their clocks are taken as one)."""
    ranks = rec.meta.get("ranks") if isinstance(rec.meta.get("ranks"), dict) else {}
    hosts = {int(r): str(v.get("host", "")) for r, v in ranks.items() if str(r).isdigit() and isinstance(v, dict)}
    # every row: a bad one is counted
    return analyse(rec.events(tables=("spans",)), rec.clock_syncs(), rec.world_size, hosts)


def _dict(value: Any) -> dict:
    return value if isinstance(value, dict) else {}


def _strings(value: Any) -> list[str]:
    return [str(v) for v in value] if isinstance(value, list) else []


def check_all(rec: Recording) -> None:
    """Read every row once: info, export and replay all do this first, so a damaged file gets the same verdict
    from each (and replay prints nothing before it). ~0.13 s per MB here."""
    check_integrity(rec)
    for _ in rec.events():
        pass
    rec.segments()  # its rows too: what it leaves out is said before anything is shown


def verdict(rec: Recording, gone: dict[int, int] | None = None) -> list[str]:
    """Why the recording is incomplete ([] when it is complete): the same words for info, export and replay."""
    reasons = []
    if rec.first_step is None:  # closed cleanly after a Ctrl-C at start-up, yet it holds no run (issue 26)
        reasons.append(f"{'stopped before any step' if _stopped(rec) else 'no step recorded'} (no training step here)")
    if rec.recorder_error:
        reasons.append(f"the recording stopped ({rec.recorder_error}); it holds what came before")
    elif not rec.complete:
        reasons.append("the recorder did not close it (killed?); data up to its last commit")
    reasons += missing_steps(rec)
    gaps = rec.query("SELECT count(*) FROM events WHERE kind = 'telemetry_gap'")[0][0]
    if gaps:
        reasons.append(f"{gaps} telemetry gap{'s' if gaps > 1 else ''} reported while recording")
    refused = sum(e.count for (blob,) in rec.query("SELECT data FROM events WHERE kind = 'events_refused'")
                  for e in [_decode(rec, blob)])
    if refused:
        reasons.append(f"{refused} event{'s' if refused > 1 else ''} refused while recording (a field of the wrong "
                       "type or range, or another rank's)")
    for rank, step in sorted((lost_ranks(rec) if gone is None else gone).items()):
        reasons.append(f"rank {rank} lost after step {step}: what it ran after its last report is not here")
    return reasons


def _stopped(rec: Recording) -> bool:
    """Closed by the front with no rank failing: a stop (the ranks said `stopped`, or were ended while starting)."""
    events = [_decode(rec, blob) for (blob,) in rec.query("SELECT data FROM events WHERE kind IN ('run_finished', "
                                                          "'log')")]
    return rec.complete and not any((isinstance(e, RunFinished) and e.reason.startswith("error"))
                                    or (isinstance(e, LogLine) and e.level == "error") for e in events)


def lost_ranks(rec: Recording) -> dict[int, int]:
    """Ranks reported lost and not heard from since (back, or finished): rank -> the last step it reported."""
    lost: dict[int, int] = {}
    for kind, rank, step in rec.query("SELECT kind, rank, step FROM events WHERE kind IN ('rank_lost', 'rank_back', "
                                      "'run_finished') ORDER BY seq"):
        if not isinstance(rank, int):
            continue
        if kind != "rank_lost":
            lost.pop(rank, None)
        else:
            last = rec.query("SELECT max(step) FROM steps WHERE rank = ?", (rank,))[0][0]
            lost[rank] = last if isinstance(last, int) else (step if isinstance(step, int) else -1)
    return lost


def missing_steps(rec: Recording) -> list[str]:
    """`rank 1 missing steps 3062-4999`: holes between a rank's recorded steps, and the steps after its last
    recorded one up to the count its RunFinished reported."""
    finished = {e.rank: e.steps for (blob,) in rec.query("SELECT data FROM events WHERE kind = 'run_finished'")
                for e in [_decode(rec, blob)]}
    recorded = {rank: (lo, hi) for rank, lo, hi in rec.query(f"SELECT rank, min(step), max(step) FROM steps WHERE "
                                                                 f"{WHOLE_STEP} GROUP BY rank")}
    out = []
    for rank in sorted(set(recorded) | set(finished)):
        lo, hi = recorded.get(rank, (None, None))
        ranges = [] if lo is None or lo == 0 else [(0, lo - 1)]
        if lo is not None:
            ranges += rec.query("SELECT step + 1, nxt - 1 FROM (SELECT step, lead(step) OVER (ORDER BY step) AS nxt "
                                f"FROM (SELECT DISTINCT step FROM steps WHERE rank = ? AND {WHOLE_STEP})) "
                                "WHERE nxt > step + 1", (rank,))
        last = -1 if hi is None else hi
        if rank in finished and finished[rank] - 1 > last:
            ranges.append((last + 1, finished[rank] - 1))
        if ranges:
            shown = ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in ranges[:5])
            out.append(f"rank {rank} missing steps {shown}{', ...' if len(ranges) > 5 else ''}")
    return out


def _finished(events: list[RunFinished]) -> list[str]:
    """`done after 7200 steps: ranks 0, 1, 2, 3` (ranks that ended alike share a line)."""
    groups: dict[tuple[str, int], list[int]] = {}
    for e in events:
        groups.setdefault((e.reason, e.steps), []).append(e.rank)
    return [f"{reason} after {steps} steps: rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, sorted(ranks)))}"
            for (reason, steps), ranks in sorted(groups.items())]


def _decode(rec: Recording, blob: Any):
    return rec._decode("events", (0, 0.0, blob))


def _error_text(e) -> str:
    return f"rank {e.rank}: {e.reason}" if isinstance(e, RunFinished) else f"rank {e.rank}: {e.message}"


def segment_stats(rec: Recording, table: list | None = None) -> list[dict[str, Any]]:
    """Per segment: the recording's switch (step, time, config, DDP buckets) and its figures (ddptop.metrics)."""
    figures = {row["segment"]: row for row in table_rows(rec.segment_figures() if table is None else table)}
    out = []
    for seg in rec.segments():
        row = figures.get(seg["index"], {})
        out.append({**seg, **{k: v for k, v in row.items() if k != "config"}})
    return out


def render(s: dict[str, Any]) -> str:
    size = s["size_bytes"] / 1e6
    state = "complete" if s["complete"] else "incomplete: " + "; ".join(s["incomplete"])
    params = f"{s['params'] / 1e6:.2f}M parameters in {s['tensors']} tensors, " if s["params"] else ""
    profile = f", profile {s['profile']}" if s["profile"] else ""
    when = datetime.datetime.fromtimestamp(s["start"]).strftime("%Y-%m-%d %H:%M:%S") if s["start"] else "?"
    steps = "no steps" if s["first_step"] is None else f"steps {s['first_step']}-{s['last_step']}"
    versions = ", ".join(f"{k} {v}" for k, v in s["versions"].items() if k != "sqlite")
    back = f" ({s['ranks_back']} came back)" if s["ranks_back"] else ""
    lines = [
        f"recording  {s['file']} ({size:.2f} MB, schema {s['schema_version']}, {state})",
        f"ran        {s['model']} ({params}{len(s['layers'])} layers with parameters) on {s['dataset']}, "
        f"{s['world_size']} ranks{profile}",
        f"where      {_where(s['ranks']) or ', '.join(s['hosts']) or '?'}",
        f"when       {when} for {_duration(s['duration_s'])}, {steps}",
        f"versions   {versions}",
        f"recorded   {s['counts']['steps']} step summaries, {s['counts']['spans']} sampled steps with spans, "
        f"{s['counts']['system']} system samples, {s['counts']['memory']} memory samples, "
        f"{s['counts']['events']} other events",
        f"events     {s['switches']} config switches, {s['ranks_lost']} ranks lost{back}, {len(s['errors'])} errors",
    ]
    timed = [seg for seg in s["segments"] if "step_s_slowest" in seg]
    if timed:
        unit = rate_unit(None if s["dataset"] == "?" else s["dataset"])
        lines += ["segments", *tables.row_lines(_figures_only(timed), indent="  ", unit=unit)]
    for seg in s["segments"]:
        if seg.get("buckets"):
            sizes = " ".join(f"{b[1] / 1e6:.{1 if b[1] >= 1e6 else 3}f}" for b in seg["buckets"]
                             if isinstance(b, list) and len(b) == 2 and isinstance(b[1], (int, float)))
            lines.append(f"  segment {seg['index']}: DDP buckets (MB, in launch order): {sizes}")
        if seg.get("switch_mb"):
            lines.append(f"  segment {seg['index']}: started at {_clock(seg['t'])}, one-off {seg['switch_mb']:.1f} MB "
                         f"broadcast from rank 0, switch took {seg['switch_s']:.2f} s")
    lines += memory_lines(s.get("memory", []))
    if "energy" in s:
        found = {int(r): RankEnergy(**e) for r, e in s["energy"].items()}
        said = energy_lines(found, s.get("energy_why", ""))
        lines += [f"energy     {said[0]}"] if not found else ["energy     joules per rank (the GPU's board)", *said]
    cost = s.get("front") or {}
    if cost.get("steps"):
        lines.append(f"front      {cost['cpu_s_per_step'] * 1e3:.2f} ms CPU per job step over {cost['steps']} steps "
                     "(its process on rank 0's host, as the kernel counted it; the ranks' own are in the table)")
    if s.get("stragglers"):
        lines.append(f"stragglers {s['stragglers']}")
    lines += [f"shifted    {x}" for x in s.get("shifts", [])[:10]]
    lines += [f"warning    {w}" for w in s["warnings"][:10]]
    lines += [f"error      {e}" for e in s["errors"][:10]]
    lines += [f"finished   {f}" for f in s["finished"]]
    return "\n".join(lines)


MEMORY_RANKS = 8  # ranks listed per segment; more are summed up as their largest


def memory_lines(rows: list[dict[str, Any]]) -> list[str]:
    """`memory` and one line per segment and rank (metrics.memory): MB held by kind and the peak, as the report's
    table has them in bytes."""
    if not rows:
        return []
    cost = max(r["cost_s"] for r in rows)  # part of ddptop's own time: the training thread measured it
    lines = [f"memory     held in each rank's own storage at a sampled step's end, MB (peak: the largest sample; "
             f"a sample took the training thread up to {cost * 1e3:.1f} ms)"]
    by_segment: dict[int, list[dict[str, Any]]] = {}
    for row in rows:
        by_segment.setdefault(row["segment"], []).append(row)
    for segment, ranks in by_segment.items():
        for r in ranks[:MEMORY_RANKS]:
            reserved = f", reserved {r['reserved_bytes'] / 1e6:.1f}" if r["by"] == "cuda allocator" else ""
            lines.append(f"  segment {segment} rank {r['rank']}: params {r['param_bytes'] / 1e6:.1f}, grads "
                         f"{r['grad_bytes'] / 1e6:.1f}, optimizer {r['optim_bytes'] / 1e6:.1f}, peak "
                         f"{r['peak_bytes'] / 1e6:.1f} ({clean(r['by'])}){reserved}")
        if len(ranks) > MEMORY_RANKS:
            rest = ranks[MEMORY_RANKS:]
            lines.append(f"  segment {segment}: {len(rest)} more ranks, the largest peak "
                         f"{max(r['peak_bytes'] for r in rest) / 1e6:.1f}")
    return lines


def _figures_only(segments: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """info's segment dicts carry the switch too; tables.cells wants a metrics row."""
    return [{**seg, "segment": seg["index"]} for seg in segments]


def _where(ranks: dict) -> str:
    by_host: dict[str, list[str]] = {}
    for rank, info in ranks.items():
        if isinstance(info, dict):
            by_host.setdefault(str(info.get("host", "?")), []).append(rank)
    parts = []
    for host, members in by_host.items():
        members.sort(key=lambda r: int(r) if r.isdigit() else 0)
        first = ranks[members[0]]
        threads = first.get("threads", "?")
        parts.append(f"{host}: ranks {', '.join(members)} ({first.get('device', '?')}, {first.get('backend', '?')}, "
                     f"{threads} thread{'' if threads == 1 else 's'} each)")
    return "; ".join(parts)


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h} h {m:02d} min" if h else (f"{m} min {s:02d} s" if m else f"{s} s")


def _clock(seconds: float) -> str:
    m, s = divmod(int(seconds), 60)
    return f"{m}:{s:02d}"


def note_incomplete(rec: Recording) -> None:
    """export and replay say what info says about a file that lacks something (one line on stderr)."""
    reasons = verdict(rec)
    if reasons:
        print(clean(f"ddptop: {rec.path} is incomplete: {'; '.join(reasons)}", 1000), file=sys.stderr)
