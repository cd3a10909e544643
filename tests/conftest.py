"""Makes the shared test helpers (jobs.py, labs.py, the CLI helpers) importable from every test folder; marks the
tests that run alone and the lab's; under CI=true turns a skip into a failure."""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))

import pytest  # noqa: E402

from skips import ci_failure  # noqa: E402

# Tests whose assertions are about time, link rates or CPU shares: `make test` runs them on their own, after the
# rest has run two at a time (pytest-xdist), so that no other test competes with them for the two cores.
# A lab's functional tests (test_lifecycle, test_lab_ctrl_c, test_refusals: what is left, exit codes, lines) run with
# the rest; two labs at once are apart (each its own namespaces, bridge and cgroups, named by its tag).
ALONE = ("tests/lab/test_course.py", "tests/lab/test_truth.py", "tests/lab/test_links.py",
         "tests/lab/test_cgroup_weight.py", "tests/lab/test_wire_bytes.py", "tests/lab/test_straggler_clocks.py",
         "tests/lab/test_hints_link.py", "tests/lab/test_outage.py", "tests/lab/test_tune_lab.py",
         "tests/ranks/test_timing_truth.py", "tests/ranks/test_micro_steps_truth.py")
# Not here: tests/tui/test_e2e_tmux.py (a real terminal; it asserts what the screen and the recording say, not how
# fast: it passed in four runs under -n 2 beside test_tune, test_generic_attack and gpu_check --cpu) and the report's
# memory test (tests/report/test_report_memory.py: peak RSS, and CPU seconds, which a neighbour on the other core
# hardly moves: 26.9 CPU-s alone against its 60 s bound).


def _skip_to_failure(report, path: str) -> None:
    """Under CI=true, a skip that skips.py does not allow becomes a failure with its reason (one line)."""
    if report.skipped and not hasattr(report, "wasxfail") and isinstance(report.longrepr, tuple):
        reason = str(report.longrepr[2]).removeprefix("Skipped: ")
        line = ci_failure(path, reason)
        if line:
            report.outcome, report.longrepr = "failed", line


LAB = "tests/lab/"  # network namespaces, shaped links, CPU quotas (root): `make lab-test`, which CI runs after `make test`


def pytest_collection_modifyitems(config, items):
    root = str(config.rootpath)
    for item in items:
        path = os.path.relpath(str(item.path), root)
        if path.startswith(ALONE):
            item.add_marker(pytest.mark.alone)
        if path.startswith(LAB):
            item.add_marker(pytest.mark.lab)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    _skip_to_failure(outcome.get_result(), os.path.relpath(str(item.path), str(item.config.rootpath)))


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    outcome = yield  # a module that skips itself as a whole (pytest.skip(allow_module_level=True), importorskip)
    _skip_to_failure(outcome.get_result(), os.path.relpath(str(collector.path), str(collector.config.rootpath)))


@pytest.fixture(scope="session", autouse=True)
def runs_dir(tmp_path_factory):
    """Every run records by default (./ddptop-runs/): the suite's runs record into a folder of their own."""
    folder = tmp_path_factory.mktemp("ddptop-runs")
    os.environ["DDPTOP_RUNS_DIR"] = str(folder)
    return folder
