"""Provides the terminal Gantt chart of one sampled step: compute, comm and overlap lanes, then one row per layer
and per collective."""

from __future__ import annotations

import math
from typing import Sequence

from rich.text import Text

from ddptop.events import Span
from ddptop.metrics.timeline import span_overlap
from ddptop.tui.render.cells import styled_runs
from ddptop.tui.render import palette
from ddptop.tui.render.palette import SPANS
from ddptop.safe import clean
from ddptop.tui.render.units import ellipsize, fmt_s

LABEL = 18  # columns for the row names (WIDE_LABEL from 120 columns on: `allreduce features.10.weight` fits)
WIDE_LABEL = 30


def _cells(span_start: float, span_end: float, total: float, cols: int) -> range:
    a = int(span_start / total * cols + 1e-6)  # 1e-6: 0.04/0.1·10 is 3.999… in floating point
    b = max(a + 1, math.ceil(span_end / total * cols - 1e-6))
    return range(max(0, a), min(cols, b))


def _lane(name: str, spans: Sequence[Span], total: float, cols: int, label_w: int = LABEL) -> Text:
    cells: list[tuple[str, str] | None] = [None] * cols
    for s in spans:
        style, glyph = SPANS.get(s.kind, ("", "█"))
        for c in _cells(s.start_s, s.end_s, total, cols):
            cells[c] = (glyph, style)
    label = Text(ellipsize(clean(name), label_w - 1).ljust(label_w), style="bold" if not name.startswith(" ") else "")
    return styled_runs((cell or ("·", palette.EMPTY) for cell in cells), label)


def _overlap_lane(spans: Sequence[Span], total: float, cols: int, label_w: int = LABEL) -> Text:
    hidden = [Span("overlap", "", a, b - a) for a, b in span_overlap(spans)[0]]  # the header's share, drawn
    return _lane("overlap", hidden, total, cols, label_w)


def overlap_words(spans: Sequence[Span], step_overlap: float | None) -> str:
    """The timeline header's overlap: the drawn spans' share (the lane's), and the step's own figure beside it where
    that differs (it counts the whole backward phase as compute; metrics.timeline.span_overlap says why)."""
    share = span_overlap(spans)[1]
    text = f"overlap {share:.0%}"
    if step_overlap is not None and round(100 * step_overlap) != round(100 * share):
        text += f" ({step_overlap:.0%} counting the whole backward pass as compute, gaps between layers included)"
    return text


def _axis(total: float, cols: int, label_w: int = LABEL) -> Text:
    ticks = [" "] * cols
    for i in range(0, 5):
        pos = int(i / 4 * (cols - 1))
        label = fmt_s(total * i / 4) if i else "0"
        start = min(max(0, pos - (len(label) // 2 if i else 0)), cols - len(label))
        ticks[start:start + len(label)] = list(label)
    return Text(" " * label_w + "".join(ticks[:cols]), style="dim")


def gantt(spans: Sequence[Span], width: int, height: int | None = None, iter_s: float | None = None) -> Text:
    """Rows: time axis, compute, comm, overlap, then per-layer fwd/bwd rows and per-collective (and wait) rows;
    with `height`, what does not fit is counted on the last row (None: every row, for a panel that scrolls)."""
    w = WIDE_LABEL if width >= 120 else LABEL
    cols = max(8, width - w)
    total = max([iter_s or 0.0] + [s.end_s for s in spans]) or 1.0
    lines = [_axis(total, cols, w),
             _lane("compute", [s for s in spans if s.kind in ("data", "fwd", "bwd", "opt")], total, cols, w),
             _lane("comm", [s for s in spans if s.kind in ("comm", "wait")], total, cols, w),
             _overlap_lane(spans, total, cols, w)]
    layers = list(dict.fromkeys(s.name for s in spans if s.kind in ("fwd", "bwd")))
    comms = [s for s in spans if s.kind in ("comm", "wait")]
    rows = [(f" {name}", [s for s in spans if s.name == name and s.kind in ("fwd", "bwd")]) for name in layers]
    rows += [(f" {s.name}", [s]) for s in comms]
    room = len(rows) if height is None else max(0, height - len(lines))
    if len(rows) > room:
        shown = rows[: max(0, room - 1)]
        lines += [_lane(name, row, total, cols, w) for name, row in shown]
        if room:
            lines.append(Text(f" … {len(rows) - len(shown)} more rows (taller terminal shows them)", style="dim"))
    else:
        lines += [_lane(name, row, total, cols, w) for name, row in rows]
    return Text("\n").join(lines if height is None else lines[: max(1, height)])
