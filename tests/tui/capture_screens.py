"""Writes the screenshots the docs link (docs/screens/): each panel at 160×48 as SVG and text and at 80×24 as text
(an 80×24 SVG is 40-60 KB nothing links), over the fixture, and the live overview as a session ends.

    .venv/bin/python tests/tui/capture_screens.py
"""

from __future__ import annotations

import asyncio
import os
import re
import sys

sys.path.insert(0, os.path.dirname(__file__))

from fixed_replay import FixedReplaySource, fixture_events  # noqa: E402
from screen_text import screen_text  # noqa: E402

from ddptop.front.pipeline import compose
from ddptop.tui.app import DdptopApp  # noqa: E402

OUT = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "screens")
PANELS = {"1": "overview", "2": "ranks", "3": "network", "4": "utilization", "5": "timeline", "6": "loss",
          "7": "controls", "8": "whatif"}


class EndedJob:
    attached = False

    def alive(self):
        return False

    def check(self):
        pass

    def lost_events(self):
        return []


def compact(svg: str) -> str:
    """Rich's SVG with its per-export class prefix (`terminal-2195334268-`, on every one of ~2,500 elements) cut to
    `t-`, and each line's indentation dropped: the same picture in two thirds of the bytes (issue 46: a light
    repository; the docs' screens were ~0.7 MB)."""
    svg = re.sub(r"terminal-\d+-", "t-", svg)
    return "\n".join(line.strip() for line in svg.splitlines())


# their SVGs were 525 KB of the repository (15 MB at most, issue 46); the text says the same
TEXT_ONLY = ("overview-live-ended-160x48", "ranks-160x48", "loss-160x48", "network-160x48", "utilization-160x48",
             "timeline-160x48", "controls-160x48", "whatif-160x48")


def save(app, stem: str) -> None:
    if not stem.endswith("-80x24") and stem not in TEXT_ONLY:
        path = app.save_screenshot(f"{stem}.svg", OUT)
        with open(path) as fh:
            text = compact(fh.read())
        with open(path, "w") as fh:
            fh.write(text)
    with open(os.path.join(OUT, f"{stem}.txt"), "w") as fh:
        fh.write(screen_text(app) + "\n")


async def capture(size: tuple[int, int]) -> None:
    app = DdptopApp(compose(FixedReplaySource(fixture_events(), at_end=True)))
    async with app.run_test(size=size) as pilot:
        for key, name in PANELS.items():
            await pilot.press(key)
            await pilot.pause(0.6)
            save(app, f"{name}-{size[0]}x{size[1]}")
    app = DdptopApp(compose(FixedReplaySource(fixture_events(), at_end=True), job=EndedJob()), mode="live", job=EndedJob(),
                    recording="ddptop-runs/20250301-142233-allreduce.db")
    async with app.run_test(size=size) as pilot:
        await pilot.pause(0.6)
        save(app, f"overview-live-ended-{size[0]}x{size[1]}")


if __name__ == "__main__":
    os.makedirs(OUT, exist_ok=True)
    asyncio.run(capture((160, 48)))
    asyncio.run(capture((80, 24)))
