"""The screen's preferences (issue 45 item 4): t switches the theme, o hides and shows the overview's sections, both
kept in the user's config folder for the next screen; --theme for one session; a file that is not ddptop's is
ignored with one line; a link planted at the file is replaced, never written through."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from textual.widgets import SelectionList

from ddptop.front.pipeline import compose
from ddptop.tui import prefs
from ddptop.tui.app import DdptopApp
from ddptop.tui.render import palette
from ddptop.tui.widgets.header import StatusHeader
from ddptop.tui.widgets.sections import SectionsScreen
from fixed_replay import FixedReplaySource
from screen_text import drawn_text

pytestmark = pytest.mark.asyncio
BIG = (160, 48)


@pytest.fixture(autouse=True)
def own_config(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.delenv(prefs.THEME_ENV, raising=False)
    yield tmp_path / "config" / "ddptop" / "screen.json"
    palette.use("dark")  # the palette is the process's: the next test's screen starts dark as its app says


def saved(path) -> dict:
    return json.loads(path.read_text())


async def test_t_switches_to_light_and_the_next_screen_opens_light(events, own_config):
    app = DdptopApp(compose(FixedReplaySource(events, at_end=True)))
    async with app.run_test(size=BIG) as pilot:
        await pilot.press("6")  # the loss panel: its plots mark each configuration change in the note colour
        await drawn_text(pilot, app, "config change")
        dark = app.export_screenshot()
        await pilot.press("t")
        await pilot.pause(0.3)
        light = app.export_screenshot()
        assert app.theme == "textual-light" and "theme: light" in app.query_one(StatusHeader).action
    # the light theme draws the markers dark gold and never Okabe-Ito's yellow, which white makes invisible
    assert palette.LIGHT_YELLOW.lower() in light.lower() and palette.LIGHT_YELLOW.lower() not in dark.lower()
    assert "#f0e442" not in light.lower() and "#56b4e9" not in light.lower()  # Okabe-Ito's yellow and sky blue
    assert saved(own_config) == {"theme": "light", "hidden": []}
    assert os.stat(own_config).st_mode & 0o777 == 0o600
    again = DdptopApp(compose(FixedReplaySource(events, at_end=True)))
    async with again.run_test(size=BIG) as pilot:
        await pilot.pause(0.1)
        assert again.theme == "textual-light" and palette.THEME == "light"
        await pilot.press("t")
        assert again.theme == "textual-dark" and saved(own_config)["theme"] == "dark"


async def test_o_hides_a_section_of_the_overview_and_it_stays_hidden(events, own_config):
    app = DdptopApp(compose(FixedReplaySource(events, at_end=True)))
    async with app.run_test(size=BIG) as pilot:
        shown = await drawn_text(pilot, app, "utilization")
        assert "per node, its job interface" in shown and "where a step's time goes" in shown
        await pilot.press("o")
        assert isinstance(app.screen, SectionsScreen)
        chooser = app.screen.query_one(SelectionList)
        order = [chooser.get_option_at_index(i).value for i in range(chooser.option_count)]
        assert order == [key for key, _ in prefs.SECTIONS] and set(chooser.selected) == set(order)
        for key in ("network", "time"):
            chooser.highlighted = order.index(key)
            await pilot.press("space")
        await pilot.press("escape")
        assert not isinstance(app.screen, SectionsScreen)
        await pilot.pause(0.2)
        text = await drawn_text(pilot, app, "utilization")
        assert "per node, its job interface" not in text and "where a step's time goes" not in text
        assert "utilization" in text and "segments" in text  # the others stay
    assert saved(own_config) == {"theme": "dark", "hidden": ["network", "time"]}
    again = DdptopApp(compose(FixedReplaySource(events, at_end=True)))
    async with again.run_test(size=(80, 24)) as pilot:  # the narrow layout hides them too
        await pilot.pause(0.1)
        text = await drawn_text(pilot, again, "segments")
        assert "RX ▲" not in text and "where a step's time goes" not in text


@pytest.mark.parametrize("content", [b"{not json", b'{"theme": "neon"}', b'{"hidden": ["ranks", 3]}',
                                     b'{"hidden": "network"}', b"[]", b" " * 5000])
async def test_a_file_that_is_not_ddptops_is_ignored_with_one_line(events, own_config, content):
    own_config.parent.mkdir(parents=True)
    own_config.write_bytes(content)
    app = DdptopApp(compose(FixedReplaySource(events, at_end=True)))
    async with app.run_test(size=BIG) as pilot:
        await pilot.pause(0.1)
        action = app.query_one(StatusHeader).action
        assert app.theme == "textual-dark" and action.startswith("screen preferences ignored") and "\n" not in action
    assert own_config.read_bytes() == content  # nothing rewritten until the user changes something


async def test_a_link_planted_at_the_file_is_replaced_not_written_through(events, own_config, tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("keep me")
    own_config.parent.mkdir(parents=True)
    own_config.symlink_to(victim)
    app = DdptopApp(compose(FixedReplaySource(events, at_end=True)))
    async with app.run_test(size=BIG) as pilot:
        await pilot.press("t")
    assert victim.read_text() == "keep me" and not own_config.is_symlink()
    assert saved(own_config)["theme"] == "light"


async def test_theme_env_is_for_one_session_and_is_not_saved(events, own_config, monkeypatch):
    monkeypatch.setenv(prefs.THEME_ENV, "light")
    app = DdptopApp(compose(FixedReplaySource(events, at_end=True)))
    async with app.run_test(size=BIG) as pilot:
        await pilot.pause(0.1)
        assert app.theme == "textual-light"
    assert not own_config.exists()


@pytest.mark.parametrize("command", [["replay", "missing.db"], ["attach"], []])
def test_a_theme_that_is_not_one_is_one_line_and_exit_2(command, tmp_path):
    run = subprocess.run([sys.executable, "-m", "ddptop", *command, "--theme", "neon"], capture_output=True,
                         text=True, cwd=tmp_path, timeout=60)
    assert run.returncode == 2 and len(run.stderr.strip().splitlines()) == 1 and "--theme" in run.stderr, run.stderr
