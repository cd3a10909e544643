"""Provides the sections chooser: which of the overview's sections show (key o), applied as they are ticked."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import SelectionList, Static

from ddptop.tui.messages import SectionsChosen
from ddptop.tui.prefs import SECTIONS


class SectionsScreen(ModalScreen):
    DEFAULT_CSS = """
    SectionsScreen { align: center middle; }
    SectionsScreen Vertical { width: 74; max-width: 100%; height: auto; max-height: 100%;
                              border: round $accent; background: $panel; padding: 0 1; }
    SectionsScreen SelectionList { height: auto; border: none; }
    """
    BINDINGS = [Binding("escape,o,enter,q", "close", "Close")]

    def __init__(self, hidden: frozenset[str]):
        super().__init__()
        self.hidden = hidden

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static("Show in the overview (space: on/off, esc: close; kept for next time)")
            yield SelectionList[str](*((label, key, key not in self.hidden) for key, label in SECTIONS),
                                     id="sections")

    def on_mount(self) -> None:
        self.query_one(SelectionList).focus()

    def on_selection_list_selected_changed(self, event: SelectionList.SelectedChanged) -> None:
        shown = set(event.selection_list.selected)
        self.post_message(SectionsChosen(frozenset(key for key, _ in SECTIONS if key not in shown)))

    def action_close(self) -> None:
        self.dismiss()
