"""Provides the network panel: slurm-style RX/TX graph per node and interface, counters, expected vs NIC bytes."""

from __future__ import annotations

from rich.text import Text
from textual import events
from textual.binding import Binding
from textual.reactive import reactive
from textual.widget import Widget

from ddptop.metrics.ranks import SCALE_RANKS
from ddptop.state.scale import scale_view
from ddptop.state.session import Snapshot
from ddptop.state.views import NodeView
from ddptop.tui.render.slurm import expected_line, nic_summary_line, slurm_graph, slurm_stats
from ddptop.safe import clean
from ddptop.tui.render.scale import nodes_summary
from ddptop.tui.widgets.detail import DetailScreen

STATS_ROWS = 7
TOP_NODES = 5  # many ranks: the nodes listed under the summary (those holding the lowest-scored ranks)


class NetworkPanel(Widget, can_focus=True):
    DEFAULT_CSS = """
    NetworkPanel { height: auto; padding: 0 1; }
    """
    BINDINGS = [Binding("up", "node(-1)", "Node ↑", show=False), Binding("down", "node(1)", "Node ↓", show=False),
                Binding("left", "iface(-1)", "Interface ←", show=False),
                Binding("right", "iface(1)", "Interface →", show=False),
                Binding("enter", "detail", "Node detail", show=False)]

    snapshot: reactive[Snapshot | None] = reactive(None, layout=True)
    """The session as of the last tick."""
    node: reactive[int] = reactive(0)
    """Index of the node shown."""
    iface: reactive[str | None] = reactive(None)
    """Interface shown; None: the node's job interface."""

    def _node(self) -> NodeView | None:
        nodes = self.snapshot.nodes if self.snapshot else ()
        return nodes[min(self.node, len(nodes) - 1)] if nodes else None

    def _ifaces(self, node: NodeView) -> list[str]:
        return sorted(node.nics)

    def render(self) -> Text:
        node, width = self._node(), max(20, self.size.width)
        if node is None or not node.nics:
            return Text("waiting for the first system sample of each node", style="dim")
        iface = self.iface if self.iface in node.nics else node.job_iface
        nic = node.nic(iface)
        nodes = self.snapshot.nodes
        out = self._title(node, iface)
        many = len(self.snapshot.ranks) >= SCALE_RANKS
        summary_rows = TOP_NODES + 5 if many else len(nodes) + 2
        visible = self.screen.size.height - 8  # header, tabs, footer (and a replay's bar): the graph fills the view,
        graph_rows = max(5, visible - STATS_ROWS - 6 - summary_rows)  # the all-nodes table below may scroll
        out.append("\n")
        out.append_text(slurm_graph(nic.rx_history, nic.tx_history, width, graph_rows))
        out.append("\n")
        out.append_text(slurm_stats(nic.stat, nic.rx_history, nic.tx_history, width))
        out.append("\n")
        out.append_text(self._expected(node, iface))
        if many:  # a line per node would push the graph off the screen: the spread and the slowest nodes instead
            out.append("\n\n")
            out.append_text(nodes_summary(self.snapshot, scale_view(self.snapshot), TOP_NODES, width))
            return out
        out.append("\n\nall nodes (their job interfaces)\n", style="bold")
        out.append("\n".join(nic_summary_line(clean(n.host), (n.nic() or nic).stat, width) for n in nodes))
        return out

    def _title(self, node: NodeView, iface: str) -> Text:
        out = Text(f"node {clean(node.host)} (ranks {', '.join(map(str, node.ranks))})  ", style="bold")
        out.append("interface ")
        for name in self._ifaces(node):
            style = "bold reverse" if name == iface else ""
            out.append(f" {clean(name)}{'*' if name == node.job_iface else ''} ", style=style)
        out.append("   ↑↓ node  ←→ interface  (* carries the job)", style="dim")
        return out

    def _expected(self, node: NodeView, iface: str) -> Text:
        config = self.snapshot.config if self.snapshot else {}
        return expected_line(node, iface, str(config.get("strategy", "?")))

    def action_node(self, delta: int) -> None:
        count = len(self.snapshot.nodes) if self.snapshot else 0
        if count:
            self.node = max(0, min(count - 1, self.node + delta))
            self.iface = None

    def action_iface(self, delta: int) -> None:
        node = self._node()
        if node is None or not node.nics:
            return
        names = self._ifaces(node)
        current = self.iface if self.iface in node.nics else node.job_iface
        i = names.index(current) if current in names else 0
        self.iface = names[(i + delta) % len(names)]

    def action_detail(self) -> None:
        node = self._node()
        if node is not None:
            self.app.push_screen(DetailScreen(self.snapshot, host=node.host))

    def on_click(self, event: events.Click) -> None:
        node = self._node()
        if node is None:
            return
        if event.y == 0:  # the title row: pick the interface under the pointer
            title = self._title(node, self.iface or node.job_iface).plain
            x = event.x - 1
            for name in self._ifaces(node):
                start = title.find(f" {name}")
                if 0 <= start <= x < start + len(name) + 2:
                    self.iface = name
            return
        first_summary = self.size.height - len(self.snapshot.nodes)  # the all-nodes table ends the panel
        if event.y >= first_summary and len(self.snapshot.ranks) < SCALE_RANKS:
            self.node = event.y - first_summary
            self.iface = None
