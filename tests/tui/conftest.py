"""Fixtures for the screen tests: the committed event fixture (a real 2-rank job) and sources over it."""

from __future__ import annotations

import os
import re
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

from fixed_replay import FixedReplaySource, fixture_events  # noqa: E402

import pytest_textual_snapshot  # noqa: E402

_normalize_svg = pytest_textual_snapshot.normalize_svg


def compact_svg(svg: str) -> str:
    """The plugin's normalized SVG (Rich's per-export id cut) with each line's indentation dropped and its `terminal-`
    class prefix cut to `t-`: the snapshots stored and the screens taken compare alike, in 7% fewer bytes (issue 46:
    the repository under 15 MB). The plugin reads and writes every snapshot through its normalize_svg."""
    svg = _normalize_svg(svg)
    return "\n".join(line.strip() for line in re.sub(r"\bterminal-([\w-]+)", r"t-\1", svg).splitlines())


pytest_textual_snapshot.normalize_svg = compact_svg


@pytest.fixture(scope="session")
def events():
    return fixture_events()


@pytest.fixture
def replay_at_end(events):
    """A paused replay positioned at the end: the first poll delivers the whole run."""
    return FixedReplaySource(events, at_end=True)
