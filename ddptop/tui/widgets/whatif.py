"""Provides the What-if panel: the model's table from the segment in force and each switch's prediction beside its
measurement, drawn by render.whatif."""

from __future__ import annotations

from rich.console import Group
from textual.reactive import reactive
from textual.widget import Widget

from ddptop.state.session import Snapshot
from ddptop.tui.render.whatif import whatif


class WhatIfPanel(Widget, can_focus=True):
    DEFAULT_CSS = """
    WhatIfPanel { height: auto; padding: 0 1; }
    """

    snapshot: reactive[Snapshot | None] = reactive(None, layout=True)
    """The session as of the last tick."""

    def render(self) -> Group:
        return whatif(self.snapshot or Snapshot(), max(40, self.size.width or 80))
