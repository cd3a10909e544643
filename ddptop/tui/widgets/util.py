"""Provides the utilization panel: CPU and memory per rank and node, GPU utilization/memory/power where present."""

from __future__ import annotations

from rich.console import Group
from rich.text import Text
from textual.reactive import reactive
from textual.widget import Widget

from ddptop.state.session import Snapshot
from ddptop.tui.render.tables import node_memory_line, util_rows


class UtilPanel(Widget, can_focus=True):
    DEFAULT_CSS = """
    UtilPanel { height: auto; padding: 0 1; }
    """

    snapshot: reactive[Snapshot | None] = reactive(None, layout=True)
    """The session as of the last tick."""

    def render(self) -> Group:
        snap = self.snapshot or Snapshot()
        width = self.size.width or 80
        return Group(Text("per rank: process CPU (history) · resident memory (history) · GPU", style="bold"),
                     util_rows(snap, width), Text(""), Text("per node", style="bold"), node_memory_line(snap))
