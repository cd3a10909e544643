"""Provides the ranks panel: the ranks table (slowest rank marked), each rank's latest step breakdown, notices; from
metrics.ranks.SCALE_RANKS ranks a summary instead (spreads, the top k by score, a rank × step heatmap)."""

from __future__ import annotations

from rich.console import Group
from rich.text import Text
from textual import events
from textual.binding import Binding
from textual.reactive import reactive
from textual.widget import Widget

from ddptop.metrics.ranks import FIGURES, SCALE_RANKS
from ddptop.state.scale import StepValues, heat, heat_rows, scale_view
from ddptop.state.session import Snapshot
from ddptop.tui.messages import RankChosen
from ddptop.tui.render.scale import LABEL, heat_legend, heatmap, spread_table, step_axis, top_table
from ddptop.tui.widgets.detail import DetailScreen
from ddptop.tui.render.breakdown import OTHER_NOTE, breakdown_bar, breakdown_legend, step_parts
from ddptop.tui.render.tables import energy_note, memory_table, ranks_table
from ddptop.safe import clean
from ddptop.tui.render.units import fmt_s


class RanksPanel(Widget, can_focus=True):
    DEFAULT_CSS = """
    RanksPanel { height: auto; min-height: 6; padding: 0 1; }
    """
    BINDINGS = [Binding("up", "move(-1)", "Rank ↑", show=False), Binding("down", "move(1)", "Rank ↓", show=False),
                Binding("enter", "choose", "Timeline of rank", show=False),
                Binding("h", "figure", "Heatmap figure", show=False), Binding("n", "node", "Node detail", show=False)]
    TALL = 30  # rows of panel from which the summary shows the top 8 ranks and a blank line between its parts

    snapshot: reactive[Snapshot | None] = reactive(None, layout=True)
    """The session as of the last tick."""
    selected: reactive[int] = reactive(0)
    """The rank the arrows and clicks pick."""
    figure: reactive[str] = reactive("busy")
    """The heatmap's figure (metrics.ranks.FIGURES), cycled by h."""

    picked = False  # many ranks: until an arrow picks one, the rank of lowest score is the one enter and n open

    @property
    def summarized(self) -> bool:
        return self.snapshot is not None and len(self.snapshot.ranks) >= SCALE_RANKS

    def current(self) -> int:
        """The rank enter and n open: the one picked, else (many ranks) the lowest score."""
        if self.summarized and not self.picked:
            return next(iter(scale_view(self.snapshot).top(1)), self.selected)
        return self.selected

    def render(self) -> Group:
        snap = self.snapshot or Snapshot()
        width = self.size.width or 80
        if self.summarized:
            return self._summary(snap, width)
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

    def _summary(self, snap: Snapshot, width: int) -> Group:
        """Many ranks: each figure's spread, the k lowest scores, a heatmap filling the rest of the screen. Below
        TALL rows (80×24) the spread keeps step, busy and exposed comm, and the titles share lines, so that the
        heatmap still shows a few rows."""
        view = scale_view(snap)
        visible = self.screen.size.height - 8  # header, tabs, footer, a replay's bar
        tall, wide = visible >= self.TALL, width >= 120
        k = self._k = 8 if tall else 3
        nodes = len({r.host for r in snap.ranks})
        head = f"{len(snap.ranks)} ranks on {nodes} node{'s' if nodes != 1 else ''}"
        figures = list(FIGURES) if tall else ["step", "busy", "exposed comm"]
        if tall:
            title = Text(f"{head}: each rank's mean over its last 10 steps; score = median busy / its busy", "bold")
            title.append("  ↑↓ rank · enter: rank · n: its node · h: figure" if wide else "", style="dim")
            parts = [title, spread_table(snap, view, wide, figures), Text(""),
                     Text(f"the {k} lowest scores", style="bold"), top_table(snap, view, k, self.current(), wide),
                     Text(""), Text(f"rank × step: {self.figure} (h: {' · '.join(FIGURES)}); a row: a node's "
                                    f"ranks, each cell the worst of them"[:width], style="bold"),
                     heat_legend(self.figure)]
        else:
            parts = [Text(f"{head}, means of last 10 steps; the {k} lowest scores"[:width - 2], "bold"),
                     spread_table(snap, view, wide, figures), top_table(snap, view, k, self.current(), wide),
                     heat_legend(self.figure, short=True)]
        used = sum(len(p.rows) + 1 if hasattr(p, "rows") else 1 for p in parts) + 1  # + the step axis
        groups = heat_rows(snap, max(2, visible - used))
        if not hasattr(self, "_values"):
            self._values = StepValues()  # the heatmap's values, read anew only for the steps that arrived
        shown = heat(snap, self.figure, groups, max(1, width - LABEL - 1), cache=self._values)
        return Group(*parts, heatmap(shown, width), step_axis(shown, width))

    def action_figure(self) -> None:
        names = list(FIGURES)
        self.figure = names[(names.index(self.figure) + 1) % len(names)]

    def action_node(self) -> None:
        if self.snapshot is not None:
            host = next((r.host for r in self.snapshot.ranks if r.rank == self.current()), None)
            if host is not None:
                self.app.push_screen(DetailScreen(self.snapshot, host=host, figure=self.figure))

    def action_move(self, delta: int) -> None:
        if self.summarized:
            shown = list(scale_view(self.snapshot).top(getattr(self, "_k", 8)))
            i = shown.index(self.current()) + delta if self.current() in shown else 0
            self.selected, self.picked = shown[max(0, min(len(shown) - 1, i))], True
            return
        ranks = [r.rank for r in (self.snapshot.ranks if self.snapshot else ())]
        if ranks:
            i = ranks.index(self.selected) if self.selected in ranks else 0
            self.selected = ranks[max(0, min(len(ranks) - 1, i + delta))]

    def action_choose(self) -> None:
        if self.summarized:
            self.app.push_screen(DetailScreen(self.snapshot, rank=self.current(), figure=self.figure))
            return
        self.post_message(RankChosen(self.selected))

    def on_click(self, event: events.Click) -> None:
        if self.summarized:
            return
        ranks = [r.rank for r in (self.snapshot.ranks if self.snapshot else ())]
        row = event.y - 1  # the table's header takes the first row
        if 0 <= row < len(ranks):
            self.selected = ranks[row]
            if event.chain > 1:
                self.action_choose()
