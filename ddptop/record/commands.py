"""`ddptop info`, `ddptop export` and `ddptop replay`: recordings from the command line, never a traceback."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from typing import Iterator, Sequence

from ddptop.cli import _Parser
from ddptop.errors import RecordingError, UsageError
from ddptop.record.reader import DAMAGE, Recording, damaged
from ddptop.record.replay import MAX_SPEED, MIN_SPEED
from ddptop.safe import clean, clean_lines


@contextlib.contextmanager
def reading(path: str, check: bool = True) -> Iterator[Recording]:
    """Open a recording; whatever its contents make fail inside the block becomes one RecordingError line."""
    rec = Recording.open(path)
    try:
        if check:
            from ddptop.record.info import check_all

            check_all(rec)
        yield rec
    except (RecordingError, UsageError):
        raise
    except DAMAGE as exc:
        if os.environ.get("DDPTOP_DEBUG"):  # a bug in a consumer, not damage? show the traceback
            raise
        raise damaged(path, exc) from None
    finally:
        rec.close()


def cmd_info(argv: Sequence[str]) -> int:
    p = _Parser(prog="ddptop info", description="What a recording holds: run, hosts, duration, segments.")
    p.add_argument("file", metavar="FILE")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    args = p.parse_args(argv)
    from ddptop.record.info import render, summary

    with reading(args.file) as rec:
        s = summary(rec)
        text = json.dumps(s, indent=2, default=str) if args.json else render(s)
    emit(text)
    return 0


def emit(text: str) -> None:
    """Print (cleaned: nothing from a file reaches the terminal raw); a reader that went away is not an error."""
    try:
        print(clean_lines(text), flush=True)
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # so the exit-time flush stays quiet


def note_incomplete(rec: Recording) -> None:
    """export and replay say what info says about a file that lacks something (one line on stderr)."""
    from ddptop.record.info import verdict

    reasons = verdict(rec)
    if reasons:
        print(clean(f"ddptop: {rec.path} is incomplete: {'; '.join(reasons)}", 1000), file=sys.stderr)


def cmd_export(argv: Sequence[str]) -> int:
    p = _Parser(prog="ddptop export", description="Export a recording to a Chrome trace (Perfetto) or CSV tables.")
    p.add_argument("file", metavar="FILE")
    p.add_argument("--chrome-trace", metavar="OUT.json", help="write a Chrome trace: one process per rank")
    p.add_argument("--csv", metavar="DIR", help="write DIR/steps.csv, DIR/system.csv and DIR/segments.csv")
    p.add_argument("--steps", metavar="A:B", help="only steps A ≤ step < B (and the samples taken meanwhile)")
    args = p.parse_args(argv)
    from ddptop.record import export

    if not args.chrome_trace and not args.csv:
        raise UsageError("nothing to export: give --chrome-trace OUT.json and/or --csv DIR")
    first, stop = export.parse_steps(args.steps)
    with reading(args.file) as rec:
        note_incomplete(rec)
        if args.chrome_trace:
            n = export.write_trace(args.chrome_trace, rec, first, stop)
            print(f"wrote {args.chrome_trace}: {n} trace events (open it in https://ui.perfetto.dev)")
        if args.csv:
            try:
                os.makedirs(args.csv, exist_ok=True)
            except OSError as exc:
                raise UsageError(f"cannot create {args.csv}: {exc.strerror or exc}") from None
            steps = export.write_csv(os.path.join(args.csv, "steps.csv"), export.STEP_COLUMNS,
                                     export.step_rows(rec, first, stop))
            system = export.write_csv(os.path.join(args.csv, "system.csv"), export.SYSTEM_COLUMNS,
                                      export.system_rows(rec, first, stop))
            segments = export.write_csv(os.path.join(args.csv, "segments.csv"), export.SEGMENT_COLUMNS,
                                        export.segment_rows(rec))
            print(f"wrote {os.path.join(args.csv, 'steps.csv')} ({steps} rows), "
                  f"{os.path.join(args.csv, 'system.csv')} ({system} rows), "
                  f"{os.path.join(args.csv, 'segments.csv')} ({segments} rows: the whole file's segment table)")
    return 0


def replay_parser() -> _Parser:
    p = _Parser(prog="ddptop replay", description="Play a recording back on the live screen (or headless).")
    p.add_argument("file", metavar="FILE")
    p.add_argument("--headless", action="store_true", help="print progress lines as the live headless run did")
    p.add_argument("--speed", type=float, default=1.0, help=f"playback speed, {MIN_SPEED:g}-{MAX_SPEED:g} (1)")
    p.add_argument("--instant", action="store_true", help="print the whole recording's lines at once (implies --headless)")
    p.add_argument("--step", type=int, metavar="N", help="start at step N")
    p.add_argument("--log-every", type=int, default=10, metavar="N", help="headless: a line every N steps (10)")
    return p


def cmd_replay(argv: Sequence[str]) -> int:
    args = replay_parser().parse_args(argv)
    if not MIN_SPEED <= args.speed <= MAX_SPEED:
        raise UsageError(f"--speed must be between {MIN_SPEED:g} and {MAX_SPEED:g}, got {args.speed:g}")
    if args.log_every < 1:
        raise UsageError("--log-every must be at least 1")
    if not args.headless and not args.instant:
        run_replay = _tui_replay()
        if run_replay is not None:
            from ddptop.record.replay import ReplaySource

            with reading(args.file) as rec:  # the same verdict as info and export before the screen opens
                note_incomplete(rec)
            from ddptop.state.session import STEP_HISTORY

            # after a seek the screen's plots show as much of the run as they ever hold
            source = ReplaySource(args.file, speed=args.speed, history_steps=STEP_HISTORY)
            if args.step is not None:
                source.seek_step(args.step)
            try:
                return run_replay(source)
            finally:
                source.close()
        print("ddptop: the live screen is not available yet; replaying headless", file=sys.stderr)
    return replay_headless(args)


def _tui_replay():
    try:
        from ddptop.tui.app import run_replay
    except ImportError as exc:  # only "the TUI is not there (yet)": a TUI that fails to import is a bug to show
        if (exc.name or "").startswith("ddptop.tui"):
            return None
        raise
    return run_replay


def replay_headless(args) -> int:
    from ddptop.headless import HeadlessPrinter
    from ddptop.record.replay import ReplaySource

    with reading(args.file) as rec:
        note_incomplete(rec)
        total = 0 if rec.last_step is None else rec.last_step + 1
        print(f"ddptop: replaying {args.file} ({rec.duration:.0f} s, {total} steps"
              f"{'' if args.instant else f' at {args.speed:g}x'})", file=sys.stderr)
        printer = HeadlessPrinter(total, every=args.log_every)
        if args.instant:
            for event in rec.events():
                if args.step is None or getattr(event, "step", args.step) >= args.step:
                    printer.handle([event])
        else:
            _play(ReplaySource(args.file, speed=args.speed), printer, args)
    printer.finish(traffic=True)
    return 0


def _play(source, printer, args) -> None:
    try:
        if args.step is not None:
            source.seek_step(args.step)
        while not source.finished:
            printer.handle(source.poll())
            time.sleep(0.05)
        printer.handle(source.poll())
    finally:
        source.close()
