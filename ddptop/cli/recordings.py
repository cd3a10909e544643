"""`ddptop info`, `ddptop export` and `ddptop replay`: recordings from the command line, never a traceback."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import sys
from typing import Iterator, Sequence

from ddptop.cli.parser import Parser, add_screen_flags, screen_flags
from ddptop.errors import RecordingError, UsageError
from ddptop.record.info import note_incomplete
from ddptop.record.reader import DAMAGE, Recording, damaged
from ddptop.record.replay import MAX_SPEED, MIN_SPEED
from ddptop.safe import clean_lines


@contextlib.contextmanager
def reading(path: str, check: bool = True) -> Iterator[Recording]:
    """Open a recording; whatever its contents make fail inside the block becomes one RecordingError line."""
    rec = Recording.open(path)
    try:
        if check:
            from ddptop.record.info import check_all

            check_all(rec)
            left_out(rec)
        yield rec
    except (RecordingError, UsageError):
        raise
    except DAMAGE as exc:
        if os.environ.get("DDPTOP_DEBUG"):  # a bug in a consumer, not damage? show the traceback
            raise
        raise damaged(path, exc) from None
    finally:
        rec.close()


def left_out(rec: Recording) -> None:
    """One line for rows the reader left out (NULL, NaN or infinite numbers): the rest is shown, and that is said."""
    line = rec.left_out_line()
    if line:
        print(f"ddptop: {rec.path}: {line}", file=sys.stderr)


def cmd_info(argv: Sequence[str]) -> int:
    p = Parser(prog="ddptop info", description="What a recording holds: run, hosts, duration, segments.")
    p.add_argument("file", metavar="FILE")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    args = p.parse_args(argv)
    from ddptop.record.info import render, summary

    with reading(args.file) as rec:
        table = rec.segment_figures()  # one pass over the steps: the tables' and the hints' predictions
        s = summary(rec, table)
        found = _hints(rec, table)
        s["hints"] = [{"segment": seg, **dataclasses.asdict(h)} for seg, h in found]
        text = json.dumps(s, indent=2, default=str) if args.json else "\n".join(
            [render(s), *(["hints"] if found else []),
             *(f"  segment {seg}: {h.line()}" for seg, h in found)])
    emit(text)
    return 0


def _hints(rec: Recording, table: list) -> list:
    """(segment, hint) for every hint the recording's segments show (ddptop.metrics.hints; README's Hints)."""
    from ddptop.errors import DdptopError
    from ddptop.report.hints import for_recording

    try:
        return [(s.index, h) for s, found in for_recording(rec, table) for h in found]
    except (DdptopError, *DAMAGE):
        if os.environ.get("DDPTOP_DEBUG"):
            raise
        return []  # what the report's statistics cannot read, info's own lines have shown as far as they can


def emit(text: str) -> None:
    """Print (cleaned: nothing from a file reaches the terminal raw); a reader that went away is not an error."""
    try:
        print(clean_lines(text), flush=True)
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # so the exit-time flush stays quiet


def cmd_export(argv: Sequence[str]) -> int:
    p = Parser(prog="ddptop export", description="Export a recording to a Chrome trace (Perfetto) or CSV tables.")
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
            rate = export.rate_column(rec)
            steps = export.write_csv(os.path.join(args.csv, "steps.csv"), export.STEP_COLUMNS,
                                     export.step_rows(rec, first, stop), rate)
            system = export.write_csv(os.path.join(args.csv, "system.csv"), export.SYSTEM_COLUMNS,
                                      export.system_rows(rec, first, stop))
            segments = export.write_csv(os.path.join(args.csv, "segments.csv"), export.SEGMENT_COLUMNS,
                                        export.segment_rows(rec), rate)
            print(f"wrote {os.path.join(args.csv, 'steps.csv')} ({steps} rows), "
                  f"{os.path.join(args.csv, 'system.csv')} ({system} rows), "
                  f"{os.path.join(args.csv, 'segments.csv')} ({segments} rows: the whole file's segment table)")
    return 0


def replay_parser() -> Parser:
    p = Parser(prog="ddptop replay", description="Play a recording back on the live screen (or headless).")
    p.add_argument("file", metavar="FILE")
    p.add_argument("--headless", action="store_true", help="print progress lines as the live headless run did")
    p.add_argument("--speed", type=float, default=1.0, help=f"playback speed, {MIN_SPEED:g}-{MAX_SPEED:g} (1)")
    p.add_argument("--instant", action="store_true", help="print the whole recording's lines at once (implies --headless)")
    p.add_argument("--step", type=int, metavar="N", help="start at step N")
    p.add_argument("--log-every", type=int, default=10, metavar="N", help="headless: a line every N steps (10)")
    add_screen_flags(p)
    return p


def cmd_replay(argv: Sequence[str]) -> int:
    args = replay_parser().parse_args(argv)
    if not MIN_SPEED <= args.speed <= MAX_SPEED:
        raise UsageError(f"--speed must be between {MIN_SPEED:g} and {MAX_SPEED:g}, got {args.speed:g}")
    if args.log_every < 1:
        raise UsageError("--log-every must be at least 1")
    screen_flags(args.theme)
    from ddptop.front import replay
    from ddptop.record.replay import ReplaySource

    if not args.headless and not args.instant:
        with reading(args.file) as rec:  # the same verdict as info and export before the screen opens
            note_incomplete(rec)
        from ddptop.state.session import STEP_HISTORY

        # after a seek the screen's plots show as much of the run as they ever hold
        source = ReplaySource(args.file, speed=args.speed, history_steps=STEP_HISTORY)
        try:
            if args.step is not None:
                source.seek_step(args.step)
            return replay.play_on_screen(source)
        finally:
            source.close()
    from ddptop.front.headless import HeadlessPrinter

    with reading(args.file) as rec:
        note_incomplete(rec)
        total = 0 if rec.last_step is None else rec.last_step + 1
        print(f"ddptop: replaying {args.file} ({rec.duration:.0f} s, {total} steps"
              f"{'' if args.instant else f' at {args.speed:g}x'})", file=sys.stderr)
        printer = HeadlessPrinter(total, every=args.log_every)
        if args.instant:
            replay.print_all(rec.events(), printer, args.step)
        else:
            source = ReplaySource(args.file, speed=args.speed)
            try:
                if args.step is not None:
                    source.seek_step(args.step)
                replay.play_headless(source, printer)
            finally:
                source.close()
    printer.finish(traffic=True)
    return 0
