"""Provides the step breakdown bar: ddptop.metrics.parts of a step (data, forward, backward, exposed comm, optimizer,
ddptop, other), one glyph and colour per part, and a legend that wraps by item."""

from __future__ import annotations

from typing import Mapping, Sequence

from rich.text import Text

from ddptop import metrics
from ddptop.events import Span, StepDone
from ddptop.metrics.timeline import breakdown, length, union
from ddptop.tui.render.cells import wrap_items
from ddptop.tui.render.palette import part_glyph, part_style
from ddptop.tui.render.units import fmt_s

OTHER_NOTE = "other: the step's time no phase accounts for (zero_grad, Python between phases)"


def step_parts(done: StepDone) -> list[tuple[str, float]]:
    """A step's parts, by the one definition (ddptop.metrics.parts): they add up to its step time."""
    return list(metrics.parts(done).items())


def _of(spans: Sequence[Span], *kinds: str) -> list[tuple[float, float]]:
    return [(s.start_s, s.end_s) for s in spans if s.kind in kinds]


def span_parts(spans: Sequence[Span], iter_s: float | None = None) -> tuple[list[tuple[str, float]], float]:
    """([(part, seconds)], overlap) from a sampled step's spans alone (a step whose StepDone is not at hand).

    `wait` spans (the training thread waiting on async handles) are not communication, as in StepDone."""
    compute = _of(spans, "fwd", "bwd", "opt")
    comm = _of(spans, "comm")
    _, _, exposed, overlap = breakdown(compute, comm)
    parts = [("data", length(_of(spans, "data"))), ("forward", length(_of(spans, "fwd"))),
             ("backward", length(_of(spans, "bwd"))), ("exposed comm", exposed),
             ("optimizer", length(_of(spans, "opt")))]
    total = max((e for _, e in union([(s.start_s, s.end_s) for s in spans])), default=0.0)
    rest = (iter_s or total) - sum(v for _, v in parts)
    if rest > 1e-6:
        parts.append(("other", rest))
    return parts, overlap


def breakdown_bar(parts: Sequence[tuple[str, float]] | Mapping[str, float], width: int, legend: bool = True,
                  scale: float | None = None) -> Text:
    """A stacked bar `width` cells wide (or `width`·sum/`scale`, to compare ranks on one scale); with `legend`,
    the legend under it (wrapped to `width`)."""
    parts = list(parts.items()) if isinstance(parts, Mapping) else list(parts)
    total = max(scale or 0.0, sum(max(0.0, v) for _, v in parts))
    width = max(1, width)
    bar = Text()
    if total <= 0:
        bar.append("·" * width, style="dim")
        return bar
    used, acc = 0, 0.0
    for kind, value in parts:
        acc += max(0.0, value)
        end = int(round(acc / total * width))
        if end > used:
            bar.append(part_glyph(kind) * (end - used), style=part_style(kind))
            used = end
    if legend:
        bar.append("\n")
        bar.append_text(breakdown_legend(parts, width))
    return bar


def breakdown_legend(parts: Sequence[tuple[str, float]] | Mapping[str, float], width: int = 10_000,
                     indent: str = "", note: str = "") -> Text:
    """`░ data 303 µs 2%  █ forward 4.7 ms 37% …`, wrapped between items, never inside one (then `note`)."""
    parts = list(parts.items()) if isinstance(parts, Mapping) else list(parts)
    total = sum(max(0.0, v) for _, v in parts) or 1.0
    items = []
    for kind, value in parts:
        if value <= 0:
            continue
        item = Text(f"{part_glyph(kind)} ", style=part_style(kind))
        item.append(f"{kind} {fmt_s(value)} {value / total:.0%}", style="default")
        items.append(item)
    if note:
        items.append(Text(note, style="dim"))
    return wrap_items(items, width, indent=indent)
