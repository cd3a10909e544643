"""Provides the ranks panel: the ranks table (slowest rank marked), each rank's latest step breakdown, notices."""

from __future__ import annotations

from rich.console import Group
from rich.text import Text
from textual import events
from textual.binding import Binding
from textual.reactive import reactive
from textual.widget import Widget

from ddptop.state.session import Snapshot
from ddptop.tui.messages import RankChosen
from ddptop.tui.render.breakdown import OTHER_NOTE, breakdown_bar, breakdown_legend, step_parts
from ddptop.tui.render.tables import energy_note, memory_table, ranks_table
from ddptop.safe import clean
from ddptop.tui.render.units import fmt_s


class RanksPanel(Widget, can_focus=True):
    DEFAULT_CSS = """
    RanksPanel { height: auto; min-height: 6; padding: 0 1; }
    """
    BINDINGS = [Binding("up", "move(-1)", "Rank ↑", show=False), Binding("down", "move(1)", "Rank ↓", show=False),
                Binding("enter", "choose", "Timeline of rank", show=False)]

    snapshot: reactive[Snapshot | None] = reactive(None, layout=True)
    """The session as of the last tick."""
    selected: reactive[int] = reactive(0)
    """The rank the arrows and clicks pick."""

    def render(self) -> Group:
        snap = self.snapshot or Snapshot()
        width = self.size.width or 80
        note = energy_note(snap)  # nothing without a GPU reading: the Utilization panel says why there is none
        parts = [ranks_table(snap, self.selected, width), *([note] if note.plain else []), Text("")]
        memory = memory_table(snap, width)
        if memory is not None:  # beside the ranks table: one row per rank again, in view at 80×24 with a few ranks
            parts += [Text(f"memory held in each rank's own storage, segment {snap.memory[0].segment} (peak: the "
                           f"largest sample)", style="bold"), memory, Text("")]
        bar_width = max(10, width - 16)
        scale = max((r.last.iter_s for r in snap.ranks if r.last), default=0.0)
        if snap.ranks:
            parts.append(Text("latest step of each rank, by part (they add up to its step time; * a sampled step)",
                              style="bold"))
        for r in snap.ranks:
            if r.last:
                line = Text(f"r{r.rank:<3}", style="bold")
                line.append_text(breakdown_bar(step_parts(r.last), bar_width, legend=False, scale=scale))
                line.append(f" {fmt_s(r.last.iter_s)}{'*' if r.last.sampled else ''}")
                parts.append(line)
        slowest = max((r.last for r in snap.ranks if r.last), key=lambda d: d.iter_s, default=None)
        if slowest:
            parts.append(Text("    ").append_text(breakdown_legend(step_parts(slowest), width - 4)))
            parts.append(Text("    " + OTHER_NOTE, style="dim"))
        if snap.notices:
            parts += [Text(""), Text("events", style="bold")]
            parts += [Text(clean(n), style="dim") for n in snap.notices[-12:]]
        return Group(*parts)

    def action_move(self, delta: int) -> None:
        ranks = [r.rank for r in (self.snapshot.ranks if self.snapshot else ())]
        if ranks:
            i = ranks.index(self.selected) if self.selected in ranks else 0
            self.selected = ranks[max(0, min(len(ranks) - 1, i + delta))]

    def action_choose(self) -> None:
        self.post_message(RankChosen(self.selected))

    def on_click(self, event: events.Click) -> None:
        ranks = [r.rank for r in (self.snapshot.ranks if self.snapshot else ())]
        row = event.y - 1  # the table's header takes the first row
        if 0 <= row < len(ranks):
            self.selected = ranks[row]
            if event.chain > 1:
                self.action_choose()
