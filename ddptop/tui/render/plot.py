"""Provides a braille line plot with several series, point marks and labelled vertical markers (config changes)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from rich.text import Text

from ddptop.tui.render import palette
from ddptop.tui.render.cells import styled_runs

# braille dot bits by (column within the cell, row within the cell)
_DOTS = ((0x01, 0x02, 0x04, 0x40), (0x08, 0x10, 0x20, 0x80))
AXIS = 8  # columns for the y labels and the axis line


@dataclass(frozen=True)
class Series:
    label: str
    style: str
    points: Sequence[tuple[float, float]]  # (x, y), x ascending
    dots_only: bool = False  # eval points: marks, no lines


@dataclass(frozen=True)
class Marker:
    x: float
    label: str


class _Canvas:
    def __init__(self, cols: int, rows: int):
        self.cols, self.rows = cols, rows
        self.bits = [[0] * cols for _ in range(rows)]
        self.style: list[list[str | None]] = [[None] * cols for _ in range(rows)]

    def dot(self, x: int, y: int, style: str) -> None:
        if 0 <= x < self.cols * 2 and 0 <= y < self.rows * 4:
            col, row = x // 2, y // 4
            self.bits[row][col] |= _DOTS[x % 2][y % 4]
            self.style[row][col] = style

    def line(self, a: tuple[int, int], b: tuple[int, int], style: str) -> None:
        (x0, y0), (x1, y1) = a, b
        steps = max(abs(x1 - x0), abs(y1 - y0), 1)
        for i in range(steps + 1):
            self.dot(round(x0 + (x1 - x0) * i / steps), round(y0 + (y1 - y0) * i / steps), style)


def _downsample(points: Sequence[tuple[float, float]], to_x: Callable[[float], int]) -> list[tuple[int, float]]:
    """One point per dot column (the mean of the points that fall in it), so 2000 steps cost 2·width dots."""
    buckets: dict[int, list[float]] = {}
    for x, y in points:
        buckets.setdefault(to_x(x), []).append(y)
    return [(x, sum(v) / len(v)) for x, v in sorted(buckets.items())]


def short_number(v: float) -> str:
    """At most 7 characters: `2.48`, `0.0312`, `2.4e-04`."""
    text = f"{v:.3g}"
    return text if len(text) <= 7 else f"{v:.1e}"


def line_plot(series: Sequence[Series], markers: Sequence[Marker], width: int, height: int,
              fmt: Callable[[float], str] = short_number, x_range: tuple[float, float] | None = None,
              y_range: tuple[float, float] | None = None, end_labels: bool = True) -> Text:
    """A plot `width`×`height` cells: y labels on the left, step labels on the last row, markers as `┊`; with
    `end_labels`, each line's label right of its last point, so lines differ by more than colour."""
    labelled = [s for s in series if s.points and not s.dots_only] if end_labels else []
    right = max((len(s.label) for s in labelled), default=-1) + 1
    cols, rows = max(4, width - AXIS - right), max(2, height - 1)
    xs = [x for s in series for x, _ in s.points] + [m.x for m in markers]
    ys = [y for s in series for _, y in s.points]
    if not xs or not ys:
        return Text("no data yet".center(width), style="dim")
    x0, x1 = x_range or (min(xs), max(xs))
    y0, y1 = y_range or (min(ys), max(ys))
    x1, y1 = (x1 if x1 > x0 else x0 + 1), (y1 if y1 > y0 else y0 + abs(y0) * 0.1 + 1e-9)
    to_x = lambda x: int((x - x0) / (x1 - x0) * (cols * 2 - 1) + 0.5)  # noqa: E731
    to_y = lambda y: int((y1 - y) / (y1 - y0) * (rows * 4 - 1) + 0.5)  # noqa: E731
    canvas = _Canvas(cols, rows)
    for s in series:
        pts = [(x, to_y(y)) for x, y in _downsample(s.points, to_x)]
        for i, p in enumerate(pts):
            if s.dots_only:  # a 2×2 block of dots: one braille dot is too small to see
                for dx, dy in ((0, 0), (1, 0), (0, 1), (1, 1)):
                    canvas.dot(p[0] - (p[0] % 2) + dx, min(p[1], rows * 4 - 2) + dy, s.style)
            elif i == 0:
                canvas.dot(*p, s.style)
            else:
                canvas.line(pts[i - 1], p, s.style)
    marker_cols = {min(cols - 1, to_x(m.x) // 2): m for m in markers if x0 <= m.x <= x1}
    lines = [_row(canvas, r, marker_cols, _y_label(r, rows, y0, y1, fmt)) for r in range(rows)]
    _label_markers(lines[0], marker_cols, cols)
    _label_ends(lines, labelled, right, lambda y: min(rows - 1, max(0, to_y(y) // 4)))
    lines.append(_x_axis(x0, x1, cols))
    return Text("\n").join(lines)


def _y_label(row: int, rows: int, y0: float, y1: float, fmt: Callable[[float], str]) -> str:
    if row == 0:
        return fmt(y1)
    if row == rows - 1:
        return fmt(y0)
    if rows > 4 and row == rows // 2:
        return fmt((y0 + y1) / 2)
    return ""


def _row(canvas: _Canvas, r: int, marker_cols: dict, label: str) -> Text:
    bits, styles = canvas.bits[r], canvas.style[r]
    cells = ((chr(0x2800 + bits[c]), styles[c] or "") if bits[c] else ("┊", palette.NOTE) if c in marker_cols else (" ", "")
             for c in range(canvas.cols))
    return styled_runs(cells, Text(label[: AXIS - 1].rjust(AXIS - 1) + "┤", style="dim"))


def _label_markers(top: Text, marker_cols: dict, cols: int) -> None:
    """Write each marker's label on the top row right of its line, or left of it at the right edge, never
    over the next label."""
    starts = sorted(marker_cols)
    taken = 0  # first free column
    for i, col in enumerate(starts):
        label = marker_cols[col].label
        end = starts[i + 1] if i + 1 < len(starts) else cols
        if end - col - 1 >= min(len(label), 12):
            at, label = col + 1, label[: end - col - 1]
        else:
            label = label[: max(0, col - taken)]
            at = col - len(label)
        if len(label) >= 3:
            plain = top.plain
            top.plain = plain[: AXIS + at] + label + plain[AXIS + at + len(label):]
            top.stylize(f"bold {palette.NOTE}", AXIS + at, AXIS + at + len(label))
            taken = at + len(label) + 1
        else:
            taken = col + 1


def _label_ends(lines: list[Text], labelled: Sequence[Series], right: int, row_of: Callable[[float], int]) -> None:
    """Each series' label in the right margin, on the row of its last point (or the nearest free row)."""
    if right <= 0:
        return
    free = set(range(len(lines)))
    for s in labelled:
        want = row_of(s.points[-1][1])
        row = min(free, key=lambda r: (abs(r - want), r), default=None)
        if row is None:
            return
        free.discard(row)
        lines[row].append(" " + s.label[: right - 1].ljust(right - 1), style=s.style)
    for row in free:
        lines[row].append(" " * right)


def _x_axis(x0: float, x1: float, cols: int) -> Text:
    left, mid, right = f"{x0:.0f}", f"{(x0 + x1) / 2:.0f}", f"{x1:.0f}"
    axis = [" "] * cols
    for pos, text in ((0, left), (cols // 2 - len(mid) // 2, mid), (cols - len(right), right)):
        for i, ch in enumerate(text):
            if 0 <= pos + i < cols:
                axis[pos + i] = ch
    return Text(" " * AXIS + "".join(axis), style="dim")
