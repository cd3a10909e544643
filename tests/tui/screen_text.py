"""Reads what a running app shows as plain text, one string per terminal row (for assertions and captures)."""

from __future__ import annotations

from textual.app import App


def screen_text(app: App) -> str:
    strips = app.screen._compositor.render_strips()
    return "\n".join("".join(segment.text for segment in strip).rstrip() for strip in strips)


async def drawn_text(pilot, app: App, want: str = "", tries: int = 200) -> str:
    """The screen's text once it holds `want` (or anything, for ""): a screen just pushed is composed and drawn on
    later turns of the app's loop, which under load (a CI run at -n 2) came after a bare press returned and the
    text read empty. Paused a loop turn at a time, at most `tries` times; the last text either way."""
    text = screen_text(app)
    for _ in range(tries):
        if text.strip() and want in text:
            break
        await pilot.pause(0.05)
        text = screen_text(app)
    return text
