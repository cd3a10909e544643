"""What the report page says, in order: warnings, what ran (provenance), the tables, the figures, the glossary."""

from __future__ import annotations

import os
from pathlib import Path

from ddptop import metrics
from ddptop.metrics import stragglers
from ddptop.metrics.memory import GLOSSARY as MEMORY_GLOSSARY
from ddptop.record import whatif
from ddptop.report import handin, hints, markdown, reference, settings, strategies
from ddptop.report.analysis import Scaling, SegmentStats
from ddptop.report.runs import RunData

TABLE_NOTE = ("Step time: wall clock from one step boundary to the next, for the slowest rank (mean, median, and "
              "p10–p90 of its measured steps) and the mean over ranks; each segment's warm-up steps and its sampled "
              "steps (layer hooks) are left out; compute, communication, overlap, ddptop's own cost and other are "
              "means over ranks; *formula* bytes follow the algorithm (ring all-reduce 2(N−1)/N·S each way; "
              "gather+scatter (N−1)·S in and out at rank 0, S at the others); *NIC* bytes are what each rank's "
              "network interface counted over the same steps, between two samples taken between two steps' "
              "traffic (in a forward pass; also in a backward pass where the strategy syncs after it), else over "
              "at least 10 steps (– when neither can be had, or when ranks share one machine's loopback, whose "
              "counters mix them: the bytes figure shows that interface once, for all of them). All-reduce bus Gbit/s "
              "is the ring formula's bus bandwidth: 2(N−1)/N·S divided by the measured communication time (HPML Lab "
              "4, Q3.2), in the unit links are rated in. The median step time, the mean over ranks, ddptop's own "
              "time, other, bytes received, CPU % (of one core, per rank process) and memory are in "
              "[segments.csv](segments.csv), every column of this table.")


def glossary_link(out: Path) -> str:
    """A relative link to the documentation's glossary (docs/reference/glossary.md) when the report is written
    inside ddptop's repository (`make reports` writes docs/reports/NAME/)."""
    root = Path(__file__).resolve().parents[2]
    glossary = root / "docs" / "reference" / "glossary.md"
    elsewhere = "docs/reference/glossary.md in ddptop's repository (the terms are also at the end of this page)"
    try:
        out.resolve().relative_to(root)
    except ValueError:
        return elsewhere
    if not glossary.exists():
        return elsewhere
    rel = os.path.relpath(glossary, out.resolve())
    return f"[the glossary]({rel}) (and at the end of this page)"


def run_lines(run: RunData, shown: list[SegmentStats], left_out: list[str], out: Path) -> list[str]:
    p = run.provenance
    link = os.path.relpath(Path(run.path).resolve(), out.resolve())
    u = markdown.untrusted
    lines = [f"recording [{markdown.code(run.path)}]({link}) ({run.size_bytes / 1e6:.2f} MB, SHA-256 "
             f"`{run.sha256[:16]}…`)",
             f"command: {markdown.code(p['command'])}",
             f"{u(run.model)} on {u(run.dataset)}"
             + (f" ({u(p['synthetic_size'])} training images)" if p.get("synthetic_size") else "")
             + f", {run.world_size} rank{'s' if run.world_size > 1 else ''}"
             + (f", profile {u(p['profile'])}" if p.get("profile") else "")
             + (f", seed {u(p['seed'])}" if p.get("seed") is not None else ""),
             f"started {u(p['when'])}, recorded for {run.duration:.0f} s",
             "hosts: " + ("; ".join(u(h) for h in p["hosts"]) or "?"),
             f"versions: {u(p['versions'] or '?')}",
             f"segments shown: {', '.join(str(s.index) for s in shown) or 'none'}; warm-up steps left out at each "
             f"segment's start: {run.warmup}"]
    lines += [f"left out: {reason}" for reason in left_out]
    return lines


def document(runs: list[RunData], shown: list[list[SegmentStats]], left_out: list[list[str]],
             stats: list[SegmentStats], made: list, scaling_rows: list[Scaling], out: Path,
             compared: list | None = None) -> list[tuple]:
    several = len(runs) > 1
    title = "ddptop report: " + ", ".join(r.name for r in runs)
    blocks: list[tuple] = [("h1", title)]
    for run in runs:
        blocks += [("warn", f"{markdown.untrusted(run.name)}: {w}") for w in run.warnings]
    blocks += [("p", f"Terms (step time, exposed communication, overlap, …) as defined in {glossary_link(out)}.")]
    blocks.append(("h2", "What ran"))
    for run, kept, reasons in zip(runs, shown, left_out):
        if several:
            blocks.append(("h3", run.name))
        blocks.append(("list", run_lines(run, kept, reasons, out)))
    blocks += [b for run, kept in zip(runs, shown)
               for b in handin.blocks(run, kept, any(c.run == run.name for c in compared or []))]
    units = sorted({metrics.rate_unit(None if r.dataset == "?" else r.dataset) for r in runs})
    blocks += [("h2", "Per segment"), markdown.segment_table(stats, " or ".join(units) or "img/s"), ("p", TABLE_NOTE)]
    blocks += hints.blocks(runs, shown)
    blocks += versus_blocks(runs)
    blocks += straggler_blocks(runs)
    blocks += memory_blocks(runs)
    blocks += strategies.blocks(runs)
    blocks += energy_blocks(runs)
    gpu = markdown.gpu_table(stats)
    if gpu:
        blocks += [("h2", "GPU memory and utilization per configuration"), gpu,
                   ("p", "As nvidia-smi shows them: the most memory used during the segment's measured steps over "
                         "the board's total, and the mean of the volatile GPU-util readings.")]
    if scaling_rows:
        blocks += hpml_tables(runs, stats, scaling_rows)
    blocks += settings.large_batch_blocks(runs, shown)
    for c in compared or []:
        blocks += [("h2", "Beside the published figures" + (f": {markdown.untrusted(c.run)}" if several else "")),
                   ("p", "The figures the run's profile reproduces, from the sources below, beside this run's: "
                         "each configuration's segments pooled (the slowest rank's mean step time, weighted by "
                         "measured steps). Hardware sets the absolute times; the order and the speedups are what "
                         "a reproduction can match.")]
        blocks += reference.blocks(c)
    blocks.append(("h2", "Figures"))
    for m in made:
        blocks += [("h3", m.title), ("figure", m)]
    # each rank's memory (metrics.memory) where a run has it: reports of older recordings stay as they were
    terms = {**metrics.GLOSSARY, **(MEMORY_GLOSSARY if any(run.memory for run in runs) else {})}
    blocks += [("h2", "Glossary"), ("table", ["term", "unit", "meaning"],
                                    [[k, u or "–", d] for k, (u, d) in terms.items()])]
    return blocks


def energy_blocks(runs: list[RunData]) -> list[tuple]:
    """Each rank's joules per step and per sample, and spent waiting in exposed communication (metrics.energy); one
    sentence where no run has any (never zeros)."""
    from ddptop.metrics.energy import RankEnergy

    rows = [[markdown.untrusted(run.name), str(r), f"{e.j_per_step:.4g}", f"{e.j_per_sample:.4g}",
             f"{e.comm_j_per_step:.4g}", f"{e.watts:.0f}", e.source, f"{e.period_s:.2g} s" if e.period_s else "–",
             str(e.steps)]
            for run in runs for r, e in sorted((int(k), RankEnergy(**v)) for k, v in run.energy.items())]
    if not rows:
        why = "; ".join(sorted({run.energy_why for run in runs if run.energy_why}))
        return [("h2", "Energy per rank"), ("p", f"None measured: {markdown.untrusted(why)}.")]
    return [("h2", "Energy per rank"),
            ("table", ["run", "rank", "J/step", "J/sample", "J/step waiting in comm", "W", "from", "read every",
                       "steps"], rows),
            ("p", "From NVML's total-energy counter (nvmlDeviceGetTotalEnergyConsumption, the whole board since the "
                  "driver loaded), read by the sampler every 0.5 s: the joules between a rank's first and last "
                  "reading over the steps received between them; where a GPU has no counter, its mean power × the "
                  "steps' time (said in the from column). Waiting in comm: the mean power × the steps' exposed "
                  "communication, an upper bound (a waiting GPU draws less than a computing one): the counter's "
                  "readings are too far apart to be differenced over a few milliseconds of communication.")]


MEMORY_NOTE = ("What each rank held in its own storage (a sharded strategy's shard, each storage once) at the end "
               "of its latest sampled step of the segment: parameters, gradients and optimizer state; peak: on a GPU "
               "the CUDA allocator's largest allocation over the segment (reserved: what the allocator held), on a "
               "CPU the largest of the process's unique memory (USS, /proc/self/smaps_rollup) read at a sampled "
               "step's end. Sampled at each segment's first step, then at most every 5 s (see the glossary). The "
               "recording's `memory` table holds every sample.")


MEMORY_RANKS = 16  # ranks listed per segment; the others in one row of their largest figures


def memory_blocks(runs: list[RunData]) -> list[tuple]:
    """Each rank's memory by kind per segment (metrics.memory; the recording's `memory` table)."""
    rows = []
    for run in runs:
        by_segment: dict[int, list] = {}
        for m in run.memory:
            by_segment.setdefault(m.segment, []).append(m)
        for segment, ranks in by_segment.items():
            rows += [_memory_row(run.name, segment, str(m.rank), [m]) for m in ranks[:MEMORY_RANKS]]
            if len(ranks) > MEMORY_RANKS:
                rest = ranks[MEMORY_RANKS:]
                rows.append(_memory_row(run.name, segment, f"{len(rest)} more (largest)", rest))
    if not rows:
        return []
    return [("h2", "Memory per rank"),
            ("table", ["run", "segment", "rank", "parameters B", "gradients B", "optimizer state B", "peak B",
                       "reserved B", "samples"], rows), ("p", MEMORY_NOTE)]


def _memory_row(run: str, segment: int, who: str, ranks: list) -> list[str]:
    """One row: a rank's figures, or the largest of each over several ranks."""
    def most(name: str) -> str:
        return str(max(getattr(m, name) for m in ranks))
    cuda = any(m.by == "cuda allocator" for m in ranks)
    return [markdown.untrusted(run), str(segment), who, most("param_bytes"), most("grad_bytes"), most("optim_bytes"),
            most("peak_bytes"), most("reserved_bytes") if cuda else "–", str(sum(m.samples for m in ranks))]


def straggler_blocks(runs: list[RunData]) -> list[tuple]:
    """Which rank the others waited for at the collectives, per segment (metrics.stragglers; README: Stragglers)."""
    def segment(run: RunData, key: int | None) -> str:
        configs = {s.index: s.config.describe() for s in run.segments}
        return "whole run" if key is None else f"{key} {markdown.untrusted(configs.get(key, ''))}".strip()

    rows = [[markdown.untrusted(run.name), segment(run, key), verdict.describe()]
            for run in runs if run.world_size > 1 for key, verdict in run.stragglers.items()]
    if not rows:
        return []
    return [("h2", "Stragglers"), ("table", ["run", "segment", "arrivals at the collectives"], rows),
            ("p", STRAGGLER_NOTE)]


def versus_blocks(runs: list[RunData]) -> list[tuple]:
    """Predicted vs measured: the what-if model fitted on the segment `ddptop advise` picks, every other segment of
    a predicted configuration beside its prediction (ddptop.record.whatif.versus; README: What-if / advise)."""
    rows, notes = [], []
    for run in runs:
        if run.versus is None:
            continue
        fitted, found, median, worst = run.versus
        rows += [[markdown.untrusted(run.name), str(r["segment"]), whatif.name(r), f"{r['measured_step_s']:.3f}",
                  f"{r['step_s']:.3f}", f"{100 * r['error']:+.1f}%", f"±{100 * r['error_se']:.1f}%"] for r in found]
        notes.append(f"{markdown.untrusted(run.name)}: fitted on segment {fitted}, median |error| {median:.1%}, "
                     f"max {worst:.1%} over {len(found)} segment{'s' if len(found) > 1 else ''}")
    if not rows:
        return []
    return [("h2", "Predicted vs measured"),
            ("table", ["run", "segment", "configuration", "measured s/step", "predicted s/step", "error", "noise"],
             rows),
            ("p", "; ".join(notes) + ". The what-if model is fitted on one segment (the first DDP one, as `ddptop "
                  "advise FILE` picks) and predicts each other segment's configuration; measured: the slowest rank's "
                  "mean step time over the segment's measured steps, as in the table above; noise: the standard "
                  "error that the two segments' step-to-step spread alone gives the error (an error within twice "
                  "its noise is as close as these segments can tell).")]


STRAGGLER_NOTE = ("On the sampled steps each rank stamps its arrival at every collective (the moment it calls it); "
                  "the ranks' clocks are aligned to rank 0's by a ping-pong over the process group at the run's "
                  "start and end (±rtt/2, drift between the two). A rank is named when it arrived last at "
                  f"≥{stragglers.SHARE:.0%} of at least {stragglers.MIN_COLLECTIVES} collectives (from "
                  f"{stragglers.MIN_STEPS} sampled steps) that every rank recorded, at more than half of them by "
                  f"more than {stragglers.NOISE_S * 1000:g} ms plus the clocks' uncertainty, and was last in more "
                  "sampled steps than chance gives one of N ranks (each step 1/N) in "
                  f"{stragglers.CHANCE:.0%} of runs: a step's collectives share its backward pass, so a step is one "
                  "piece of evidence. Transfer: the last arriving rank's own time in the collective.")


def hpml_tables(runs: list[RunData], stats: list[SegmentStats], rows: list[Scaling]) -> list[tuple]:
    """HPML Lab 4 tables 1-3 over several world sizes: epoch time and speedup, compute vs communication per epoch,
    bandwidth utilization. An epoch is the run's images per epoch at the measured rate."""
    images = {r.label: r.epoch_images for r in runs}
    configs = sorted({r.config for r in rows}, key=lambda c: (len(c), c))  # those run at several world sizes
    worlds = sorted({s.world_size for s in stats})
    cell = {(s.world_size, s.config.describe()): s for s in stats}
    base = {c: cell.get((worlds[0], c)) for c in configs}

    def epoch_s(s: SegmentStats) -> float:
        return images.get(s.label, 0) / s.images_per_s if s.images_per_s else 0.0

    def steps(s: SegmentStats) -> float:
        return images.get(s.label, 0) / (s.world_size * s.config.batch_size * s.config.accum)  # K·b·N a step

    t1, t2, t3 = [], [], []
    for n in worlds:
        row1, row2, row3 = [f"{n}"], [f"{n}"], [f"{n}"]
        for c in configs:
            s, b = cell.get((n, c)), base[c]
            if s is None:
                row1 += ["–", "–"]
                row2 += ["–", "–"]
                row3 += ["–"]
                continue
            row1 += [_seconds(epoch_s(s)), f"{epoch_s(b) / epoch_s(s):.2f}" if b and epoch_s(s) else "–"]
            row2 += [_seconds(s.compute_s * steps(s)), _seconds(s.comm_s * steps(s))]
            row3 += [_opt(s.bus_gbit_s)]
        t1.append(row1)
        if n > 1:
            t2.append(row2)
            t3.append(row3)
    return [("h2", "HPML Lab 4: speedup, compute vs communication, bandwidth utilization"),
            ("p", f"**Table 1**: time per epoch (s) and speedup over {worlds[0]} rank(s), batch size fixed per rank "
                  "(weak scaling). An epoch is the run's images per epoch (steps per epoch × batch × ranks at its "
                  "start) at each configuration's measured img/s."),
            ("table", ["ranks"] + [f"{c}: {h}" for c in configs for h in ("time (s)", "speedup")], t1),
            ("p", "**Table 2**: compute and communication per epoch (s): the mean per step over ranks × steps per "
                  "epoch at that batch size."),
            ("table", ["ranks"] + [f"{c}: {h}" for c in configs for h in ("compute (s)", "comm (s)")], t2),
            ("p", "**Table 3**: bandwidth utilization (Gbit/s; ×1/8 for the lab's GB/s): the ring all-reduce's 2(N−1)/N·S bytes per rank "
                  "divided by the measured communication time per step."),
            ("table", ["ranks"] + [f"{c}: bandwidth (Gbit/s)" for c in configs], t3)]


def _seconds(value: float) -> str:
    """Three significant digits, never in exponent form: 1150, 829, 3.52."""
    return f"{value:.0f}" if abs(value) >= 100 else f"{value:.3g}"


def _opt(value: float | None) -> str:
    return "–" if value is None else f"{value:.3f}"
