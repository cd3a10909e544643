"""Provides `styled_runs`: a row of (character, style) cells as Text with one span per run, not per cell."""

from __future__ import annotations

from typing import Iterable

from rich.text import Text


def styled_runs(cells: Iterable[tuple[str, str]], prefix: Text | None = None) -> Text:
    """A 140-cell chart row becomes a handful of spans: styling each cell alone costs ~20× more to draw."""
    out = prefix.copy() if prefix is not None else Text()
    run_chars: list[str] = []
    run_style: str | None = None
    for char, style in cells:
        if style != run_style and run_chars:
            out.append("".join(run_chars), style=run_style or None)
            run_chars = []
        run_style = style
        run_chars.append(char)
    if run_chars:
        out.append("".join(run_chars), style=run_style or None)
    return out


def wrap_items(items: Iterable[Text], width: int, gap: str = "  ", indent: str = "") -> Text:
    """Items joined by `gap`, a new line (starting with `indent`) before any item that would cross `width`: a
    legend wraps by item."""
    out, col = Text(), 0
    for item in items:
        size = item.cell_len
        if col and col + len(gap) + size > width:
            out.append("\n" + indent)
            col = len(indent)
        elif col:
            out.append(gap)
            col += len(gap)
        out.append_text(item)
        col += size
    return out
