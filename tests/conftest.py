"""Makes the shared test helpers (jobs.py, labs.py, the CLI helpers) importable from every test folder."""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))

import pytest  # noqa: E402

# Tests whose assertions are about time, link rates or CPU shares: `make test` runs them on their own, after the
# rest has run two at a time (pytest-xdist), so that no other test competes with them for the two cores.
ALONE = ("tests/lab/", "tests/ranks/test_timing_truth.py", "tests/tui/test_e2e_tmux.py")


def pytest_collection_modifyitems(config, items):
    root = str(config.rootpath)
    for item in items:
        path = os.path.relpath(str(item.path), root)
        if path.startswith(ALONE):
            item.add_marker(pytest.mark.alone)


@pytest.fixture(scope="session", autouse=True)
def runs_dir(tmp_path_factory):
    """Every run records by default (./ddptop-runs/): the suite's runs record into a folder of their own."""
    folder = tmp_path_factory.mktemp("ddptop-runs")
    os.environ["DDPTOP_RUNS_DIR"] = str(folder)
    return folder
