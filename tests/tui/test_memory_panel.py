"""The Ranks panel's memory table (issue 43) in the running app, at 80×24 and 160×48: each rank's parameters,
gradients, optimizer state and peak of the newest segment sampled, the numbers the samples carry; the committed
fixture (a real 2-rank job from before memory samples) with samples added at its end. A recording without samples
(the fixture alone) shows no memory table: the panel as it was."""

from __future__ import annotations

import pytest

from ddptop.events import MemorySample
from ddptop.front.pipeline import compose
from ddptop.tui.app import DdptopApp
from fixed_replay import FixedReplaySource
from screen_text import drawn_text

pytestmark = pytest.mark.asyncio
TITLE = "memory held in each rank's own storage"


def _samples(events) -> list[MemorySample]:
    end = max(getattr(e, "t", 0.0) for e in events)
    return [MemorySample(0, 390, 3, end - 2, 7_364_648, 7_364_648, 7_364_648, 290_600_000, 290_600_000, 0,
                         "process USS", 0.03),
            MemorySample(1, 390, 3, end - 2, 7_364_648, 7_364_648, 7_364_648, 281_800_000, 281_800_000, 0,
                         "process USS", 0.03),
            MemorySample(1, 396, 3, end - 1, 7_364_648, 7_364_648, 7_364_648, 282_100_000, 280_000_000, 0,
                         "process USS", 0.03)]


async def _ranks_text(events, size) -> str:
    app = DdptopApp(compose(FixedReplaySource(events, at_end=True)))
    async with app.run_test(size=size) as pilot:
        await pilot.press("2")
        return await drawn_text(pilot, app, "latest step of each rank")


@pytest.mark.parametrize("size", [(80, 24), (160, 48)], ids=["80x24", "160x48"])
async def test_the_ranks_panel_shows_each_ranks_memory_by_kind(events, size):
    text = await _ranks_text(events + _samples(events), size)
    lines = text.splitlines()
    title = next(i for i, line in enumerate(lines) if TITLE in line)
    assert "segment 3" in lines[title]
    header, rank0, rank1 = (lines[title + k].split() for k in (1, 2, 3))
    assert header[:4] == ["rank", "params", "grads", "optimizer"]
    # 7.4 MB of each kind; the peak: rank 1's larger sample (282.1 MB), not its latest (280.0 MB)
    assert rank0[:7] == ["0", "7.4", "MB", "7.4", "MB", "7.4", "MB"] and "290.6" in rank0
    assert rank1[0] == "1" and "282.1" in rank1 and "280.0" not in rank1[:-6 if size[0] >= 120 else None]
    if size[0] >= 120:  # wide: their sum, the latest value, the step and what measured it
        assert header[4:] == ["held", "peak", "now", "step", "measured", "by"]
        assert "22.1" in rank1 and "280.0" in rank1 and "396" in rank1 and lines[title + 3].endswith("(USS)")
    assert all(len(line) <= size[0] for line in lines)


async def test_without_memory_samples_the_panel_has_no_memory_table(events):
    assert TITLE not in await _ranks_text(events, (160, 48))
