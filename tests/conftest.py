"""Shared fixtures: real jobs started through ddptop's own front process, events collected in the test."""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))


@pytest.fixture
def fast_env(monkeypatch):
    """Keep child ranks quiet and single-threaded unless a test says otherwise."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    yield
