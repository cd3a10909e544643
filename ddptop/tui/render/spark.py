"""Provides sparklines and htop-style percentage bars as Rich Text."""

from __future__ import annotations

from typing import Sequence

from rich.text import Text

TICKS = "▁▂▃▄▅▆▇█"


def sparkline(values: Sequence[float], width: int, top: float | None = None, style: str = "cyan") -> Text:
    """The last `width` values as one line of block ticks scaled to `top` (default: their maximum)."""
    values = list(values)[-width:] if width > 0 else []
    peak = top if top is not None else max(values, default=0.0)
    if peak <= 0:
        return Text(" " * (width - len(values)) + TICKS[0] * len(values), style=style)
    chars = [TICKS[min(len(TICKS) - 1, max(0, int(v / peak * (len(TICKS) - 1) + 0.5)))] for v in values]
    return Text(" " * (width - len(values)) + "".join(chars), style=style)


def pct_bar(percent: float | None, width: int, style: str = "green", label: str | None = None) -> Text:
    """`[||||||||      42%]`: a bar `width` cells wide including the brackets; None draws `[   -   ]`."""
    inner = max(1, width - 2)
    if percent is None:
        return Text("[" + "-".center(inner) + "]", style="dim")
    text = label if label is not None else f"{percent:.0f}%"
    filled = int(round(min(max(percent, 0.0), 100.0) / 100.0 * inner))
    body = ("|" * filled).ljust(inner)
    body = body[: inner - len(text)] + text if len(text) < inner else body
    out = Text("[", style="bold")
    out.append(body[:filled], style=style)
    out.append(body[filled:], style="dim" if not text else "")
    out.append("]", style="bold")
    return out
