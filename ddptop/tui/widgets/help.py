"""Provides the help screen: every key, from the one key table."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from ddptop.tui.keys import help_text


class HelpScreen(ModalScreen):
    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen VerticalScroll { width: 96; max-width: 100%; height: auto; max-height: 100%;
                                border: round $accent; background: $panel; padding: 0 1; }
    """
    BINDINGS = [Binding("escape,q,question_mark", "close", "Close help")]

    def __init__(self, replay: bool):
        super().__init__()
        self.replay = replay

    def compose(self) -> ComposeResult:
        with VerticalScroll():
            yield Static(help_text(self.replay), id="help-text")

    def action_close(self) -> None:
        self.dismiss()
