"""Provides NumberInput: an Input for numbers that lets every other key (q, ?, space) reach the app's bindings."""

from __future__ import annotations

from textual import events
from textual.widgets import Input

NUMBER_CHARS = frozenset("0123456789.-+eE")


class NumberInput(Input):
    """A plain Input would swallow `q` and `?` as text; a number never needs them."""

    def check_consume_key(self, key: str, character: str | None) -> bool:
        return character is not None and character in NUMBER_CHARS

    async def _on_key(self, event: events.Key) -> None:
        if event.is_printable and event.character not in NUMBER_CHARS:
            # Textual runs every class's _on_key down the MRO: without prevent_default Input's would still type the
            # key (issue 26: a space went into the batch field). It bubbles up to the app: q quits, ? helps, space
            # pauses.
            event.prevent_default()
            return
        await super()._on_key(event)
