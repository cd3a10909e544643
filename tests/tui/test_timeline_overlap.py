"""The timeline's overlap figure and its overlap lane agree (issue 44: "overlap 93%" above an empty lane). On the
committed live-switch.db (tiny model, DDP at 0.05 MB, gloo on CPU), rank 0's sampled step 1072: bucket 0 was
reduced between two layers' backward (no layer ran beside it), so no cell of the lane is overlap, and the header
says 0%, with the step's own figure (77%: the whole backward phase counted as compute) named beside it. The
expected share is computed here from the spans row SQL reads, not by ddptop."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from ddptop.front.pipeline import compose
from ddptop.record.reader import Recording
from ddptop.tui.app import DdptopApp
from ddptop.tui.widgets.timeline import TimelinePanel
from fixed_replay import FixedReplaySource
from screen_text import drawn_text

pytestmark = pytest.mark.asyncio

REC = Path(__file__).resolve().parents[2] / "recordings" / "live-switch.db"
RANK, STEP = 0, 1072


def hidden_share() -> float:
    """Communication time during which a layer or the optimizer ran, over the communication time (SQL's spans)."""
    with sqlite3.connect(REC) as con:
        row = con.execute("SELECT spans FROM spans WHERE rank = ? AND step = ?", (RANK, STEP)).fetchone()
    rows = json.loads(row[0])
    compute = [(start, start + dur) for kind, _, start, dur, *_ in rows if kind in ("fwd", "bwd", "opt")]
    comm = [(start, start + dur) for kind, _, start, dur, *_ in rows if kind == "comm"]
    hidden = sum(max(0.0, min(b, d) - max(a, c)) for a, b in comm for c, d in compute)  # layers never overlap
    return hidden / sum(b - a for a, b in comm)


async def test_the_header_states_the_overlap_the_lane_draws():
    with sqlite3.connect(REC) as con:
        step_overlap = con.execute("SELECT overlap FROM steps WHERE rank = ? AND step = ?", (RANK, STEP)).fetchone()[0]
    share = hidden_share()
    assert share == 0.0 and step_overlap > 0.7  # the premise: the disagreement, in a real recording
    with Recording.open(str(REC)) as rec:
        events = rec.between(float("-inf"), rec.time_of_step(STEP + 1))
    app = DdptopApp(compose(FixedReplaySource(events, at_end=True)))
    async with app.run_test(size=(160, 48)) as pilot:
        await pilot.press("5")
        panel = app.query_one(TimelinePanel)
        panel.rank, panel.step = RANK, STEP
        text = await drawn_text(pilot, app, f"sampled step {STEP}")
    head = next(line for line in text.splitlines() if f"rank {RANK} · sampled step {STEP}" in line)
    assert f"overlap {share:.0%} ({step_overlap:.0%} counting the whole backward pass" in head, head
    lane = next(line for line in text.splitlines() if line.strip().startswith("overlap "))
    assert "█" not in lane, lane  # no cell of overlap drawn: the lane and the header say the same
