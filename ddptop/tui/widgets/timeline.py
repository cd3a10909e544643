"""Provides the timeline panel: one sampled step of one rank as a Gantt chart, its breakdown and overlap."""

from __future__ import annotations

from rich.text import Text
from textual.binding import Binding
from textual.reactive import reactive
from textual.widget import Widget

from ddptop.state.session import Snapshot
from ddptop.tui.render.breakdown import OTHER_NOTE, breakdown_bar, span_parts, step_parts
from ddptop.tui.render.gantt import gantt, overlap_words
from ddptop.tui.render.units import fmt_s


class TimelinePanel(Widget, can_focus=True):
    DEFAULT_CSS = """
    TimelinePanel { height: auto; min-height: 100%; padding: 0 1; }
    """
    BINDINGS = [Binding("left", "step(-1)", "Step ←", show=False), Binding("right", "step(1)", "Step →", show=False),
                Binding("up", "rank(-1)", "Rank ↑", show=False), Binding("down", "rank(1)", "Rank ↓", show=False),
                Binding("less_than_sign", "first", "First step", show=False),
                Binding("greater_than_sign", "latest", "Latest", show=False)]

    snapshot: reactive[Snapshot | None] = reactive(None, layout=True)
    """The session as of the last tick."""
    rank: reactive[int] = reactive(0)
    """The rank shown."""
    step: reactive[int | None] = reactive(None)
    """The sampled step shown; None follows the latest."""

    _key: tuple = ()
    _text: Text = Text()

    def _steps(self) -> list[int]:
        return self.snapshot.spans.steps(self.rank) if self.snapshot else []

    def shown_step(self) -> int | None:
        steps = self._steps()
        if not steps:
            return None
        return self.step if self.step in steps else steps[-1]

    def render(self) -> Text:
        step, width = self.shown_step(), max(30, self.size.width)
        spans = self.snapshot.spans.get(self.rank, step) if step is not None else None
        key = (self.rank, step, self.step is None, width, id(spans), len(self._steps()))
        if key != self._key:  # the chart changes every --span-every steps, not every tick
            self._key, self._text = key, self._draw(step, width)
        return self._text

    def _draw(self, step: int | None, width: int) -> Text:
        if step is None:
            return Text(f"rank {self.rank}: no sampled step yet (per-layer spans come every --span-every steps)",
                        style="dim")
        spans = self.snapshot.spans.get(self.rank, step)
        done = next((d for d in self.snapshot.history.get(self.rank, ()) if d.step == step), None)
        iter_s = done.iter_s if done else None
        if done is not None:  # the step's own figures (ddptop.metrics): the bar adds up to its step time
            parts = step_parts(done)
        else:
            parts, _ = span_parts(spans.spans, iter_s)
        steps = self._steps()
        out = Text(f"rank {self.rank} · sampled step {step} · segment {spans.segment}", style="bold")
        # the overlap the lane below draws (one definition), the step's own figure beside it where they differ
        out.append(f" · step time {fmt_s(iter_s)} · {overlap_words(spans.spans, done.overlap if done else None)}")
        follow = " (following the latest)" if self.step is None else ""
        out.append(f" · sampled steps {steps[0]}…{steps[-1]}{follow}   ←→ step ↑↓ rank < > first/latest", style="dim")
        out.append("\n")
        out.append_text(breakdown_bar(parts, width))
        out.append("\n")
        out.append(f"a sampled step: layer hooks ran, so it is slower than the others (time figures leave it out). "
                   f"{OTHER_NOTE}; wait: blocked on an async handle (not communication)", style="dim")
        out.append("\n")
        out.append_text(gantt(spans.spans, width, None, iter_s))
        return out

    def action_step(self, delta: int) -> None:
        steps = self._steps()
        current = self.shown_step()
        if current is not None:
            self.step = steps[max(0, min(len(steps) - 1, steps.index(current) + delta))]

    def action_rank(self, delta: int) -> None:
        ranks = [r.rank for r in (self.snapshot.ranks if self.snapshot else ())]
        if ranks:
            i = ranks.index(self.rank) if self.rank in ranks else 0
            self.rank = ranks[max(0, min(len(ranks) - 1, i + delta))]

    def action_first(self) -> None:
        steps = self._steps()
        self.step = steps[0] if steps else None

    def action_latest(self) -> None:
        self.step = None
