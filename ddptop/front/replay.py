"""Provides `ddptop replay`'s front: a recording through the same pipeline as a live job, on the screen or as lines."""

from __future__ import annotations

import sys
import time

from ddptop.front.headless import HeadlessPrinter
from ddptop.front.pipeline import compose

REFRESH_S = 0.05  # headless replay polls its source this often: lines come at the recording's own pace


def play_on_screen(source) -> int:
    """The same screens over a recording (`source`: a ReplaySource the caller closes). Without a terminal (a pipe, a
    test, CI) the screen cannot run: the recording plays headless instead, at its speed, as progress lines."""
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        print("ddptop: no terminal for the replay screen; replaying headless", file=sys.stderr)
        end = source.status().get("step_end")
        source.play()
        play_headless(source, HeadlessPrinter(end + 1 if end is not None else 0))
        return 0
    from ddptop.state.session import STEP_HISTORY
    from ddptop.tui.app import DdptopApp  # textual loads only when the screen is wanted

    source.history_steps = max(source.history_steps, STEP_HISTORY)  # after a seek, plots show what they can
    DdptopApp(compose(source), mode="replay", recording=getattr(source, "path", None)).run()
    return 0


def play_headless(source, printer: HeadlessPrinter) -> None:
    """The recording's lines at its own pace, through the pipeline into the printer's state."""
    feed = compose(source, state=printer.state)
    while not source.finished:
        feed.pump()
        time.sleep(REFRESH_S)
    feed.pump()


def print_all(events, printer: HeadlessPrinter, first_step: int | None = None) -> None:
    """`replay --instant`: the whole recording's lines at once, through the same pipeline."""
    feed = compose(None, state=printer.state)
    for event in events:
        if first_step is None or getattr(event, "step", first_step) >= first_step:
            feed.push([event])
