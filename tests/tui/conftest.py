"""Fixtures for the screen tests: the committed event fixture (a real 2-rank job) and sources over it."""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

from fixed_replay import FixedReplaySource, fixture_events  # noqa: E402


@pytest.fixture(scope="session")
def events():
    return fixture_events()


@pytest.fixture
def replay_at_end(events):
    """A paused replay positioned at the end: the first poll delivers the whole run."""
    return FixedReplaySource(events, at_end=True)
