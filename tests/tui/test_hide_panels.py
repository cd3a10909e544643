"""Hiding and showing panels (issue 45 item 4): ctrl+x hides the panel shown, its number shows it again, ctrl+o all."""

from __future__ import annotations

import pytest

from ddptop.front.pipeline import compose
from ddptop.tui.app import DdptopApp
from fixed_replay import FixedReplaySource
from screen_text import drawn_text


@pytest.mark.asyncio
async def test_ctrl_x_hides_the_panel_shown_and_its_number_or_ctrl_o_shows_it(events):
    app = DdptopApp(compose(FixedReplaySource(events, at_end=True)))
    async with app.run_test(size=(160, 48)) as pilot:
        tabs = app.query_one("TabbedContent")
        await pilot.press("3", "ctrl+x")
        await pilot.pause(0.2)
        assert not tabs.get_tab("network").display and tabs.active == "util"
        assert "3 Network" not in (await drawn_text(pilot, app, "4 Utilization")).splitlines()[3]
        await pilot.press("tab", "tab", "tab", "tab", "tab", "tab", "tab")  # seven panels left: around once
        assert tabs.active == "util"
        await pilot.press("3")
        await pilot.pause(0.2)
        assert tabs.get_tab("network").display and tabs.active == "network"
        await pilot.press("ctrl+x", "1", "ctrl+x")
        await pilot.pause(0.2)
        assert [p for p in ("overview", "network") if tabs.get_tab(p).display] == []
        await pilot.press("ctrl+o")
        await pilot.pause(0.2)
        assert all(tabs.get_tab(p).display for p in ("overview", "network"))
        assert "3 Network" in (await drawn_text(pilot, app, "3 Network")).splitlines()[3]
