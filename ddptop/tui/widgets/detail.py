"""Provides the detail of one rank or one node over a many-ranks screen: its rows of the ranks table and its heatmap."""

from __future__ import annotations

from rich.console import Group
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from ddptop.metrics.ranks import FIGURES
from ddptop.safe import clean
from ddptop.state.scale import heat, node_groups, scale_view
from ddptop.tui.messages import RankChosen
from ddptop.tui.render.breakdown import breakdown_bar, breakdown_legend, step_parts
from ddptop.tui.render.scale import heat_legend, heatmap, step_axis
from ddptop.tui.render.tables import ranks_table
from ddptop.tui.render.units import fmt_s

WIDTH = 150  # the modal's width at most (less on a narrower screen)


def rank_detail(snap, rank: int, width: int) -> Group:
    """One rank: its row of the ranks table, its score, its latest step by part, each figure's row of the heatmap."""
    view = scale_view(snap)
    host = next((r.host for r in snap.ranks if r.rank == rank), "?")
    title = Text(f"rank {rank} on node {clean(host)}", style="bold")
    if rank in view.scores:
        title.append(f"  score {view.scores[rank]:.2f} (the median rank's busy time / its own; "
                     f"{view.order.index(rank) + 1} of {len(view.order)} by score)", style="")
    parts: list = [title, ranks_table(snap, rank, width, only={rank}), Text("")]
    last = next((r.last for r in snap.ranks if r.rank == rank and r.last), None)
    if last is not None:
        parts += [Text("its latest step by part", style="bold"),
                  breakdown_bar(step_parts(last), max(10, width - 14), legend=False).append(f" {fmt_s(last.iter_s)}"),
                  breakdown_legend(step_parts(last), width), Text("")]
    parts.append(Text("each figure at each step (its row of the heatmap for each figure)", style="bold"))
    for name in FIGURES:
        parts.append(heatmap(heat(snap, name, [(name, (rank,))], width, job=True), width))
    return Group(*parts)


def node_detail(snap, host: str, width: int) -> Group:
    """One node: its ranks' rows of the ranks table, its NIC's line, a heatmap row per rank of the figure shown."""
    ranks = dict(node_groups(snap)).get(host, ())
    node = next((n for n in snap.nodes if n.host == host), None)
    parts: list = [Text(f"node {clean(host)}: ranks {', '.join(map(str, ranks))} (they share its NIC)", style="bold"),
                   ranks_table(snap, None, width, only=set(ranks)), Text("")]
    nic = node.nic() if node is not None else None
    if nic is not None:
        from ddptop.tui.render.slurm import nic_summary_line

        parts += [Text("its job interface", style="bold"), Text(nic_summary_line(host, nic.stat, width)), Text("")]
    return Group(*parts)


class DetailScreen(ModalScreen):
    """A rank's or a node's detail; esc closes, t (a rank) opens its timeline."""

    DEFAULT_CSS = """
    DetailScreen { align: center middle; }
    DetailScreen VerticalScroll { width: 150; max-width: 100%; height: auto; max-height: 100%;
                                  border: round $accent; background: $panel; padding: 0 1; }
    """
    BINDINGS = [Binding("escape,q,enter", "close", "Close"), Binding("t", "timeline", "Its timeline")]

    def __init__(self, snap, rank: int | None = None, host: str | None = None, figure: str = "busy"):
        super().__init__()
        self.snap, self.rank, self.host, self.figure = snap, rank, host, figure

    def compose(self) -> ComposeResult:
        with VerticalScroll():
            yield Static(id="detail-text")
            yield Static(Text("esc closes" + (" · t: its timeline" if self.rank is not None else ""), style="dim"))

    def on_mount(self) -> None:
        width = min(WIDTH, self.app.size.width) - 4
        if self.rank is not None:
            body = rank_detail(self.snap, self.rank, width)
        else:
            body = node_detail(self.snap, self.host or "?", width)
            ranks = dict(node_groups(self.snap)).get(self.host, ())
            shown = heat(self.snap, self.figure, [(f"r{r}", (r,)) for r in ranks], width, job=True)
            body = Group(body, Text("each rank at each step", style="bold"), heat_legend(self.figure),
                         heatmap(shown, width), step_axis(shown, width))
        self.query_one("#detail-text", Static).update(body)

    def action_close(self) -> None:
        self.dismiss()

    def action_timeline(self) -> None:
        if self.rank is not None:
            self.dismiss()
            self.app.post_message(RankChosen(self.rank))
