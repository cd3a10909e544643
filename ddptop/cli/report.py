"""`ddptop report FILE [FILE ...] -o DIR`: report.md, report.html, figures (PNG, SVG, PDF) and figures.json."""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from pathlib import Path
from typing import Sequence

from ddptop.errors import DdptopError, UsageError
from ddptop.safe import replacing

MIN_MEASURED = 3  # by default a segment needs warm-up + 3 steps: fewer give no step time worth a bar


class Parser(argparse.ArgumentParser):
    def error(self, message: str):
        raise UsageError(f"{message} (see ddptop report --help)")


def parser() -> argparse.ArgumentParser:
    p = Parser(prog="ddptop report", description="Write a report (markdown, HTML, figures) from recordings.")
    p.add_argument("files", nargs="+", metavar="FILE", help="recordings (several: compared in one report)")
    p.add_argument("-o", "--out", required=True, metavar="DIR", help="folder for report.md, report.html and figures")
    p.add_argument("--warmup", type=int, help="steps left out at each segment's start (default: the sweep's, else 1)")
    p.add_argument("--segments", default="", metavar="LIST",
                   help="segments to show, e.g. 1,3-5 (in every FILE), or all; default: every segment with at least "
                        f"warm-up + {MIN_MEASURED} steps")
    p.add_argument("--formats", default="png,svg,pdf", metavar="LIST",
                   help="figure formats, png among them (report.html embeds it): png,svg,pdf (default) or png alone, "
                        "about half the time")
    return p


def parse_formats(spec: str) -> tuple[str, ...]:
    """`png,svg` → ('png', 'svg'); PNG must be among them, nothing but png/svg/pdf."""
    from ddptop.report.plot import FORMATS

    chosen = tuple(dict.fromkeys(f.strip().lower() for f in spec.split(",") if f.strip()))
    unknown = [f for f in chosen if f not in FORMATS]
    if unknown or "png" not in chosen:
        raise UsageError(f"--formats {spec!r}: a comma-separated list of png, svg, pdf with png in it")
    return chosen


def parse_segments(spec: str) -> set[int] | None:
    """`1,3-5` → {1, 3, 4, 5}; `all` → None (every segment)."""
    if spec.strip() == "all":
        return None
    chosen: set[int] = set()
    for part in spec.split(","):
        m = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", part)
        if not m or (m.group(2) and int(m.group(2)) < int(m.group(1))):
            raise UsageError(f"--segments: {part.strip()!r} is not a segment number or range like 3-5 (or: all)")
        chosen.update(range(int(m.group(1)), int(m.group(2) or m.group(1)) + 1))
    return chosen


def select(run, spec: str) -> tuple[list, list[str]]:
    """The segments to show and, for each left out by default, why."""
    if spec:
        chosen = parse_segments(spec)
        if chosen is None:
            return list(run.segments), []
        known = {s.index for s in run.segments}
        missing = sorted(chosen - known)
        if missing:
            raise UsageError(f"--segments: {run.path} has no segment {', '.join(map(str, missing))} (it has "
                             f"{', '.join(map(str, sorted(known)))})")
        return [s for s in run.segments if s.index in chosen], []
    need = run.warmup + MIN_MEASURED
    kept = [s for s in run.segments if s.length >= need]
    reasons = [f"segment {s.index} ({s.config.describe()}): {s.length} step{'s' if s.length != 1 else ''}, fewer than "
               f"warm-up {run.warmup} + {MIN_MEASURED}; `--segments all` shows it"
               for s in run.segments if s.length < need]
    if not kept:
        return list(run.segments), [f"every segment is shorter than warm-up {run.warmup} + {MIN_MEASURED} steps: "
                                    "all are shown"]
    return kept, reasons


def labels(paths: Sequence[str]) -> list[str]:
    """Each recording's name in a report of several: its file name, numbered where two share one."""
    stems = [Path(p).stem for p in paths]
    return [f"{stem}#{stems[:i].count(stem) + 1}" if stems.count(stem) > 1 else stem for i, stem in enumerate(stems)]


def cmd_report(argv: Sequence[str]) -> int:
    args = parser().parse_args(argv)
    if args.warmup is not None and args.warmup < 0:
        raise UsageError("--warmup must be ≥ 0")
    if args.segments:
        parse_segments(args.segments)  # a bad list fails before any recording is read
    formats = parse_formats(args.formats)
    from ddptop.report.runs import load

    several = len(args.files) > 1
    runs = [load(path, args.warmup, label) for path, label in zip(args.files, labels(args.files) if several else
                                                                   [""] * len(args.files))]
    shown, left_out = [], []
    for run in runs:
        kept, reasons = select(run, args.segments)
        shown.append(kept)
        left_out.append(reasons)
        for reason in reasons:
            print(f"ddptop report: {run.name}: left out {reason}", file=sys.stderr)
    out = Path(args.out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"cannot create {out}: {exc.strerror}") from None
    try:
        from ddptop.report.plot import formats as writing

        with writing(formats):
            made, _ = write(runs, shown, left_out, out)
    except OSError as exc:  # disk full, a file where a figure goes
        raise DdptopError(f"cannot write the report in {out}: {exc.strerror or exc}") from None
    kinds = ", ".join(f.upper() for f in formats)
    print(f"wrote {out / 'report.md'}, {out / 'report.html'} and {len(made)} figures ({kinds})")
    return 0


def write(runs, shown, left_out, out: Path):
    from ddptop.report import bucket_models, figures, html, markdown, page, reference, settings, sweeps, timeseries, versus
    from ddptop.report.analysis import scaling
    from ddptop.report.labels import common, short_names

    stats = [s for kept in shown for s in kept]
    names = short_names(stats)
    subtitle = common(stats)
    several = len(runs) > 1
    made = [figures.step_time(stats, names, out, subtitle), figures.breakdown(stats, names, out, subtitle),
            figures.bytes_per_step(stats, names, out, subtitle), figures.cpu_memory(stats, names, out, subtitle)]
    made += [m for m in (sweeps.bucket_size(stats, out), sweeps.batch_size(stats, out), sweeps.sync_async(stats, out))
             if m is not None]
    tradeoff = settings.accum_compress(stats, names, {run.label: run.points for run in runs}, out)
    made += [tradeoff] if tradeoff is not None else []
    if several:  # one recording per model (a run has one model): the lecture's latency vs bucket size per model
        per_model = bucket_models.figure(stats, {r.label: r.model for r in runs}, bucket_models.setup(runs), out)
        made[:0] = [per_model] if per_model is not None else []  # first: the figure such a report is made for
    rows = scaling(stats)
    if rows:
        made.append(sweeps.scaling_figure(rows, out))
    compared = []
    for run in runs:
        c = reference.compare(run.name, reference.load(run.provenance["profile"]),
                              [s for s in stats if s.label == run.label])
        if c is not None:
            compared.append(c)
            made.append(reference.figure(c, out, f"reference-{run.label}" if several else "reference"))
    for run in runs:
        mine = [i for i, s in enumerate(stats) if s.label == run.label]
        args = (run, [stats[i] for i in mine], [names[i] for i in mine], mine, out, several)
        made += [m for m in (timeseries.loss_accuracy(*args), timeseries.network(*args), timeseries.system(*args))
                 if m is not None]
    made += [m for m in (versus.figure(runs, out),) if m is not None]  # the Predicted vs measured table, drawn
    blocks = page.document(runs, shown, left_out, stats, made, rows, out, compared)
    data = {m.name: {"title": m.title, "finding": m.finding, **m.data} for m in made}
    for name, text in (("report.md", markdown.render(blocks)), ("segments.csv", markdown.segment_csv(stats)),
                       ("report.html", html.render(blocks, out, blocks[0][1])),
                       ("figures.json", json.dumps(_finite(data), indent=1, allow_nan=False) + "\n")):
        with replacing(out / name) as f:  # -o may be a folder others write: a link planted at a name is replaced
            f.write(text)
    return made, blocks


def _finite(value):
    """JSON has no NaN: a value not drawn (NaN) is null."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value
