"""Makes the shared test helpers (jobs.py, labs.py, the CLI helpers) importable from every test folder."""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))

import pytest  # noqa: E402


@pytest.fixture(scope="session", autouse=True)
def runs_dir(tmp_path_factory):
    """Every run records by default (./ddptop-runs/): the suite's runs record into a folder of their own."""
    folder = tmp_path_factory.mktemp("ddptop-runs")
    os.environ["DDPTOP_RUNS_DIR"] = str(folder)
    return folder
