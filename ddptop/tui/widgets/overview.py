"""Provides the overview panel (the default): the whole run at a glance, drawn by render.overview."""

from __future__ import annotations

from rich.console import Group
from textual.reactive import reactive
from textual.widget import Widget

from ddptop.state.session import Snapshot
from ddptop.tui.render.overview import overview


class OverviewPanel(Widget, can_focus=True):
    DEFAULT_CSS = """
    OverviewPanel { height: auto; padding: 0 1; }
    """

    snapshot: reactive[Snapshot | None] = reactive(None, layout=True)
    """The session as of the last tick."""
    banner: reactive[str] = reactive("", layout=True)
    """A line above everything: how the session ended, where it was recorded."""
    hidden: reactive[frozenset[str]] = reactive(frozenset(), layout=True)
    """The sections the user turned off (key o; tui.prefs.SECTIONS)."""

    def render(self) -> Group:
        return overview(self.snapshot or Snapshot(), max(40, (self.size.width or 80)), self.banner, self.hidden)
