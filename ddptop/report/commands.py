"""`ddptop report FILE [FILE ...] -o DIR`: markdown and PNG figures from one or several recordings."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Sequence

from ddptop.errors import RecordingError, UsageError


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):
        raise UsageError(f"{message} (see ddptop report --help)")


def parser() -> argparse.ArgumentParser:
    p = _Parser(prog="ddptop report", description="Write a markdown report with figures from recordings.")
    p.add_argument("files", nargs="+", metavar="FILE", help="recordings (several: compared in one report)")
    p.add_argument("-o", "--out", required=True, metavar="DIR", help="folder for report.md and the PNG figures")
    p.add_argument("--warmup", type=int, help="steps dropped at each segment's start (default: the sweep's, else 1)")
    return p


def load(path: str, warmup: int | None, label: str):
    from ddptop.record.reader import Recording
    from ddptop.report.analysis import segment_stats

    from ddptop.record.commands import note_incomplete
    from ddptop.record.info import verdict

    with Recording.open(path) as rec:
        events = list(rec.events())
        config = rec.config
        meta = rec.meta
        duration = rec.duration
        incomplete = verdict(rec)
        note_incomplete(rec)
    try:
        stats = segment_stats(events, label=label, warmup=warmup, run_config=config)
    except (UsageError, TypeError, ValueError, KeyError, AttributeError) as exc:  # values no ddptop wrote
        raise RecordingError(f"{path} cannot be reported on: {str(exc).splitlines()[0] if str(exc) else exc!r}"
                             ) from None
    if not stats:
        raise RecordingError(f"{path} holds no training steps to report on")
    used = warmup if warmup is not None else (config.get("sweep_warmup", 5) if config.get("sweep") else 1)
    rdv = meta.get("rendezvous") if isinstance(meta.get("rendezvous"), dict) else {}
    run = {"path": path, "label": label, "model": config.get("model", "?"), "dataset": config.get("dataset", "?"),
           "world_size": stats[0].world_size, "source": rdv.get("source", "?"), "duration": duration,
           "segments": len(stats), "warmup": used, "incomplete": incomplete}
    from ddptop.events import RunStarted

    started = next((e for e in events if isinstance(e, RunStarted)), None)
    return run, stats, (started.param_bytes if started else 0)


def cmd_report(argv: Sequence[str]) -> int:
    args = parser().parse_args(argv)
    if args.warmup is not None and args.warmup < 0:
        raise UsageError("--warmup must be ≥ 0")
    from ddptop.report import figures, markdown
    from ddptop.report.analysis import scaling

    several = len(args.files) > 1
    runs, stats, param_bytes = [], [], 0
    for path in args.files:
        run, run_stats, param_bytes = load(path, args.warmup, f"{Path(path).stem}:" if several else "")
        runs.append(run)
        stats += run_stats
    out = Path(args.out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"cannot create {out}: {exc.strerror}") from None
    made = [("Step time per configuration", figures.step_time(stats, out)),
            ("Bytes per step: NIC vs formulas", figures.bytes_per_step(stats, param_bytes, out)),
            ("CPU and memory per configuration", figures.cpu_memory(stats, out)),
            ("Loss per configuration", figures.loss(stats, out)),
            ("Compute vs communication", figures.breakdown(stats, out))]
    rows = scaling(stats)
    if rows:
        made.append(("Speedup and scaling efficiency", figures.scaling_figure(rows, out)))
    (out / "report.md").write_text(markdown.document(runs, stats, made, rows))
    print(f"wrote {out / 'report.md'} and {len(made)} figures")
    return 0
