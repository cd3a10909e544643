"""The light theme (issue 45 item 4): t turns the screen light and back, its panels still drawn (tui/test_screen_prefs.py:
its colours, and that it is kept)."""

from __future__ import annotations

import pytest

from ddptop.front.pipeline import compose
from ddptop.tui.app import DdptopApp
from ddptop.tui.render import palette
from fixed_replay import FixedReplaySource
from screen_text import drawn_text


@pytest.fixture(autouse=True)
def own_config(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))  # t saves the theme: into this test's folder
    yield
    palette.use("dark")


@pytest.mark.asyncio
async def test_t_turns_the_screen_light_and_back(events):
    app = DdptopApp(compose(FixedReplaySource(events, at_end=True)))
    async with app.run_test(size=(100, 30)) as pilot:
        await drawn_text(pilot, app, "ranks")
        dark = app.screen.styles.background
        assert dark.brightness < 0.5
        await pilot.press("t")
        await pilot.pause(0.2)
        assert app.theme == "textual-light" and app.screen.styles.background.brightness > 0.5
        assert "ranks" in await drawn_text(pilot, app, "ranks")  # the overview still drawn, over the light screen
        await pilot.press("t")
        await pilot.pause(0.2)
        assert app.screen.styles.background == dark
