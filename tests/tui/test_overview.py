"""The overview (the default panel) at 160×48 and 80×24, scrolling, focus, how a session says it ended, and states
that must never be stale: paused rates, diverged models, a replay's counters."""

from __future__ import annotations

import pytest
from textual.widgets import TabbedContent

from ddptop.front.pipeline import compose
from ddptop import metrics
from ddptop.metrics import tables
from ddptop.events import RunState
from ddptop.events import ModelsDiverged
from ddptop.tui.app import DdptopApp
from ddptop.tui.widgets.overview import OverviewPanel
from fixed_replay import FixedReplaySource
from screen_text import screen_text

pytestmark = pytest.mark.asyncio


class _EndedJob:
    attached = False

    def alive(self):
        return False

    def check(self):
        pass

    def lost_events(self):
        return []


async def test_at_160x48_the_whole_run_is_on_one_screen_with_the_segment_table_of_info(events):
    app = DdptopApp(compose(FixedReplaySource(events, at_end=True), job=_EndedJob()), mode="live", job=_EndedJob(), recording="runs/x.db")
    async with app.run_test(size=(160, 48)) as pilot:
        await pilot.pause(0.6)
        assert app.query_one(TabbedContent).active == "overview" and isinstance(app.focused, OverviewPanel)
        text = screen_text(app)
        for words in ("ranks", "mean10", "where a step's time goes", "╳ exposed comm", "other = ", "segments",
                      "loss", "step time", "communication", "network", "Σ ranks 0, 1", "no comparison (lo shared)",
                      "utilization", "r1  CPU"):
            assert words in text, (words, text)
        snap = app.state.snapshot()
        rows = metrics.table_rows(snap.segment_figures)
        assert len(rows) == 4
        for row in rows:  # the cells `ddptop info` prints, from the same SessionState figures
            cells = tables.cells(row)
            line = next(line for line in text.split("\n") if line.split()[:2] == [str(row["segment"]), cells[1]])
            assert cells[2] in line and all(cell in line for cell in cells[3:]), (cells, line)
        # how the session ended, where it was recorded, what to do next
        assert "The run has ended: 400 steps on 2 ranks (done)" in text
        assert "Recorded to runs/x.db; after q: ddptop report runs/x.db -o runs/x-report" in text


async def test_at_80x24_a_reduced_overview_keeps_the_state_and_scrolls_to_the_rest(events):
    app = DdptopApp(compose(FixedReplaySource(events, at_end=True), job=_EndedJob()), mode="live", job=_EndedJob(),
                    recording="ddptop-runs/20250301-142233-a-long-name-that-cannot-fit-on-one-line.db")
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause(0.6)
        text = screen_text(app)
        header = text.split("\n")[0]
        assert header.startswith("  LIVE  finished · step 400/400") and "rec ● ddptop-runs/" in header
        assert "mean10" in text and "The run has ended" in text
        pane = app.query_one(TabbedContent).active_pane
        assert pane.max_scroll_y > 0 and pane.scroll_y == 0
        await pilot.press("pagedown")
        await pilot.pause(0.2)
        assert pane.scroll_y > 0
        await pilot.press("end")
        await pilot.pause(0.2)
        assert pane.scroll_y == pane.max_scroll_y and "utilization" in screen_text(app)
        await pilot.press("home")
        await pilot.pause(0.2)
        assert pane.scroll_y == 0


@pytest.mark.parametrize("key,bottom", [("3", "all nodes"), ("5", "wait async"), ("7", "Apply")])
async def test_long_panels_scroll_from_the_keyboard_at_80x24(events, key, bottom):
    app = DdptopApp(compose(FixedReplaySource(events, at_end=True)))
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press(key)
        await pilot.pause(0.6)
        pane = app.query_one(TabbedContent).active_pane
        if bottom != "Apply":  # the controls fit once their preview is empty (a replay): nothing to scroll
            assert pane.max_scroll_y > 0 and bottom not in screen_text(app)
        await pilot.press("end")
        await pilot.pause(0.3)
        assert bottom in screen_text(app)


async def test_paused_rates_say_paused_and_a_divergence_stays_in_sight(events):
    last = max(e.step for e in events if hasattr(e, "step") and type(e).__name__ == "StepDone")
    extra = [RunState(0, last, True, 2e9), RunState(1, last, True, 2e9),
             ModelsDiverged(3, 308, "segment start", {"0": "aa" * 32, "1": "bb" * 32}, 2e9)]
    source = FixedReplaySource([e for e in events if type(e).__name__ != "RunFinished"] + extra, at_end=True)
    app = DdptopApp(compose(source), mode="live")
    async with app.run_test(size=(160, 48)) as pilot:
        await pilot.pause(0.6)
        text = screen_text(app).split("\n")
        assert "paused" in text[0] and "img/s paused" in text[0]
        assert text[2].startswith(" ⚠ models differ at the segment start of segment 3")
        overview = "\n".join(text[5:])
        assert "⚠ models differ" in overview
        ranks = [line for line in text if line.split()[:2] in (["0", "vm"], ["1", "vm"])]
        assert len(ranks) == 2 and all(" paused " in line for line in ranks)  # state and img/s


async def test_a_replay_says_it_is_a_replay_and_its_counters_agree(events):
    source = FixedReplaySource(events, at_end=True)
    app = DdptopApp(compose(source))
    async with app.run_test(size=(160, 48)) as pilot:
        await pilot.pause(0.6)
        text = screen_text(app)
        assert text.startswith("  REPLAY  ⏸ paused · job finished") and "rec off" not in text
        assert "· segment 3 ·" in text.split("\n")[0] and "segment 3 of 0–3" in text
        assert "· step 400/400 ·" in text.split("\n")[0] and "step 400/400 t " in text  # one way to count steps
