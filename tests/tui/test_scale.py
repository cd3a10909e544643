"""Many ranks at a glance (issue 45): a 256-rank recording that this test makes with simulated ranks, a few of them made
slow from step 70, written by ddptop's recorder and replayed into the app; the Ranks and Network panels summarize.

The figures are checked against the recording itself (SQL on its `steps` rows, statistics and numpy), the top k
against the ranks the test slowed, the heatmap's colour against the cells of those ranks at those steps. Two Pilot
snapshots (160×48, 80×24) keep the picture.
"""

from __future__ import annotations

import os
import sqlite3
import statistics
import sys

import numpy
import pytest

from ddptop.front.pipeline import compose
from ddptop.metrics.ranks import SCALE_RANKS, heat_level
from ddptop.record.replay import ReplaySource
from ddptop.state.scale import heat, scale_view
from ddptop.tui.app import DdptopApp
from ddptop.tui.render.palette import HEAT, HOT
from ddptop.tui.render.scale import heatmap
from ddptop.tui.render.units import fmt_s
from ddptop.tui.widgets.detail import DetailScreen
from screen_text import drawn_text, screen_text

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))
import scale_screen  # noqa: E402  (the simulated job; the benchmark measures the screen over the same job)

RANKS, STEPS = 256, 120
SLOW = {37: 2.2, 150: 1.6, 201: 2.5}  # rank → factor on its busy time from step 70 (scale_screen.SLOW_FROM)


@pytest.fixture(scope="module")
def recording(tmp_path_factory):
    assert RANKS >= SCALE_RANKS
    path = str(tmp_path_factory.mktemp("scale") / "256-ranks.db")
    return scale_screen.record(path, scale_screen.simulate(RANKS, STEPS, SLOW))


def sql_windows(path: str) -> dict[int, dict[str, float]]:
    """Each rank's means over its last 10 steps, by SQL on the recording's rows (not by ddptop's code)."""
    db = sqlite3.connect(path)
    rows = db.execute("""SELECT rank, AVG(iter_s), AVG(exposed_comm_s), AVG(compute_s), AVG(data_s) FROM
                         (SELECT rank, iter_s, exposed_comm_s, compute_s, data_s,
                                 ROW_NUMBER() OVER (PARTITION BY rank ORDER BY step DESC) AS back FROM steps
                          WHERE sampled = 0) WHERE back <= 10 GROUP BY rank""").fetchall()
    db.close()
    return {r: {"step": it, "busy": it - ex, "exposed comm": ex, "compute": c, "data": d} for r, it, ex, c, d in rows}


async def replayed(app: DdptopApp, pilot, source: ReplaySource, want: str) -> str:
    """The screen once the replay is at its last step and `want` and the heatmap's last row (…-255) are drawn."""
    source.seek_step(STEPS - 1)
    app.tick()
    await drawn_text(pilot, app, want)
    return await drawn_text(pilot, app, "-255 ")


@pytest.mark.asyncio
async def test_the_summary_is_the_recordings_spread_top_k_and_heatmap(recording):
    windows = sql_windows(recording)
    assert len(windows) == RANKS
    source = ReplaySource(recording, playing=False, history_steps=STEPS)
    app = DdptopApp(compose(source))
    try:
        async with app.run_test(size=(160, 48)) as pilot:
            await pilot.press("2")
            text = await replayed(app, pilot, source, "lowest scores")
            view = scale_view(app.state.snapshot())
            for name in ("step", "busy", "compute", "exposed comm", "data"):
                values = [w[name] for w in windows.values()]
                want = {"median": statistics.median(values), "p90": float(numpy.percentile(values, 90)),
                        "worst": max(values)}
                assert view.spreads[name] == pytest.approx(want, rel=1e-9), name
                row = next(line for line in text.splitlines() if line.strip().startswith(name + "  "))
                assert row.split()[len(name.split()):][:6] == " ".join(
                    fmt_s(want[s]) for s in ("median", "p90", "worst")).split(), row
            busy = {r: w["busy"] for r, w in windows.items()}
            middle = statistics.median(busy.values())
            assert view.top(3) == (201, 37, 150)  # the ranks the test slowed, the slowest first
            assert view.scores[201] == pytest.approx(middle / busy[201]) and 0.35 < view.scores[201] < 0.45
            lines = text.split("the 8 lowest scores")[1].splitlines()[2:5]
            assert [line.split()[:3] for line in lines] == [
                [str(r), f"node{r // 8:02d}", f"{middle / busy[r]:.2f}"] for r in (201, 37, 150)]
            # the screen's heatmap: node24-25's row (rank 201) is hot from step 70 on and cool before; a row
            # without a slowed rank is cool everywhere
            rows = {line.split()[1]: line for line in text.splitlines() if line.startswith(" node") and " r" in line}
            cells = rows["r192-207"][20:]
            assert set(cells[70:]) == {HEAT[3][1]} and set(cells[:70]) == {HEAT[0][1]}, cells
            assert set(rows["r96-111"][20:].strip()) == {HEAT[0][1]}
            await pilot.press("h")  # the next figure: compute, also the slowed ranks' (their busy is compute)
            assert "rank × step: compute" in await drawn_text(pilot, app, "rank × step: compute")
    finally:
        source.close()


def test_a_slowed_ranks_cell_is_the_hot_colour_at_the_slow_steps(recording):
    source = ReplaySource(recording, playing=False, history_steps=STEPS)
    from ddptop.state.session import SessionState

    state = SessionState()
    try:
        source.seek_step(STEPS - 1)
        state.apply_all(source.poll())
    finally:
        source.close()
    snap = state.snapshot()
    shown = heat(snap, "busy", [(f"r{r}", (r,)) for r in (0, 150, 201)], STEPS, job=True)
    assert shown.first == 0 and len(shown.cells[0]) == STEPS
    every = [scale_screen.busy(r, s, SLOW) for r in range(RANKS) for s in range(STEPS)]
    assert shown.middle == pytest.approx(statistics.median(every))
    text = heatmap(shown, 200)
    label = 19
    for row, rank in enumerate((0, 150, 201)):
        for step in (10, 69, 70, 119):
            value = scale_screen.busy(rank, step, SLOW)
            level = heat_level(value, shown.middle)
            offset = sum(len(line) + 1 for line in text.plain.splitlines()[:row]) + label + step
            styles = [span.style for span in text.spans if span.start <= offset < span.end]
            assert text.plain[offset] == HEAT[level][1] and styles == [HEAT[level][0]], (rank, step)
    hot = [s for s in range(STEPS) if heat_level(shown.cells[2][s], shown.middle) == 3]
    assert hot == list(range(70, STEPS)) and HEAT[3][0] == HOT  # rank 201, 2.5× from step 70: hot, and only there
    assert all(heat_level(v, shown.middle) == 0 for v in shown.cells[0])  # rank 0 never is


@pytest.mark.asyncio
async def test_a_rank_and_a_node_open_their_detail(recording):
    source = ReplaySource(recording, playing=False, history_steps=STEPS)
    app = DdptopApp(compose(source))
    try:
        async with app.run_test(size=(160, 48)) as pilot:
            await pilot.press("2")
            await replayed(app, pilot, source, "lowest scores")
            await pilot.press("down", "enter")  # from the lowest score (rank 201) to the next: rank 37
            text = await drawn_text(pilot, app, "rank 37 on node node04")
            assert isinstance(app.screen, DetailScreen) and "2 of 256 by score" in text, text
            await pilot.press("escape", "n")
            text = await drawn_text(pilot, app, "node node04: ranks 32, 33, 34, 35, 36, 37, 38, 39")
            assert isinstance(app.screen, DetailScreen) and "each rank at each step" in text
            await pilot.press("escape", "3")
            text = await drawn_text(pilot, app, "nodes holding the lowest-scored ranks")
            tail = text.split("nodes holding the lowest-scored ranks")[1].splitlines()[1:4]
            assert [line.split()[0] for line in tail] == ["node25", "node04", "node18"], tail
            assert "r200-207 lowest 0.40 (r201)" in tail[0]
    finally:
        source.close()


@pytest.mark.parametrize("size", [(160, 48), (80, 24)], ids=["160x48", "80x24"])
def test_snapshot_of_256_ranks(snap_compare, recording, size):
    source = ReplaySource(recording, playing=False, history_steps=STEPS)

    async def run_before(pilot):
        await pilot.press("2")
        await replayed(pilot.app, pilot, source, "lowest scores")
        # the footer's keys: a run drew the picture before them; they follow a refresh of the bindings
        pilot.app.screen.refresh_bindings()
        assert "Pause/resume" in await drawn_text(pilot, pilot.app, "Pause/resume")

    try:
        assert snap_compare(DdptopApp(compose(source)), run_before=run_before, terminal_size=size)
    finally:
        source.close()


@pytest.mark.asyncio
async def test_ranks_that_joined_but_have_not_stepped_are_summarized_without_an_error():
    """A replay's first moments, a job's start: 16 ranks joined, no step yet (a heatmap of nothing: the redraw
    raised on an empty rank's values once)."""
    from fixed_replay import FixedReplaySource

    app = DdptopApp(compose(FixedReplaySource(scale_screen.simulate(SCALE_RANKS, 0), at_end=True)))
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("2")
        text = await drawn_text(pilot, app, "16 ranks on 2 nodes")
        assert "16 ranks on 2 nodes" in text and "the 3 lowest scores" in text, text
        await pilot.press("h", "n")
        await pilot.pause(0.2)


@pytest.mark.asyncio
@pytest.mark.parametrize("size", [(160, 48), (80, 24)])
async def test_the_overview_summarizes_too(recording, size):
    """The default panel at 256 ranks: the spread and the 3 lowest scores (the slowed ranks, by SQL's windows)
    instead of a row per rank; 4 of the 32 nodes' graphs (those of the slowed ranks first) and 3 ranks' utilization."""
    windows = sql_windows(recording)
    busy = {r: w["busy"] for r, w in windows.items()}
    middle = statistics.median(busy.values())
    slowest = sorted(busy, key=lambda r: middle / busy[r])[:3]
    assert slowest == [201, 37, 150]
    source = ReplaySource(recording, playing=False, history_steps=STEPS)
    app = DdptopApp(compose(source))
    try:
        async with app.run_test(size=size) as pilot:
            source.seek_step(STEPS - 1)
            app.tick()
            text = await drawn_text(pilot, app, "lowest scores")
            lines = text.split("the 3 lowest scores")[1].splitlines()[2:5]
            assert [line.split()[:3] for line in lines] == [
                [str(r), f"node{r // 8:02d}", f"{middle / busy[r]:.2f}"] for r in slowest], text
            assert "256 on 32 nodes" in text
            # below the first screen: scroll the overview through, every section summarized
            pane = app.query_one("#overview")
            seen = text
            for _ in range(12):
                pane.scroll_page_down(animate=False)
                await pilot.pause(0.1)
                seen += "\n" + screen_text(app)
            assert "4 of 32 nodes" in seen and "3 of 256 ranks" in seen, seen
            assert not any(line.lstrip().startswith(("r100 ", "r255 ")) for line in seen.splitlines())
    finally:
        source.close()
