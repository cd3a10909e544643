"""Makes the shared test helpers (jobs.py, labs.py, the CLI helpers) importable from every test folder; marks the
tests that run alone; under CI=true turns a skip into a failure."""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))

import pytest  # noqa: E402

from skips import ci_failure  # noqa: E402

# Tests whose assertions are about time, link rates or CPU shares: `make test` runs them on their own, after the
# rest has run two at a time (pytest-xdist), so that no other test competes with them for the two cores.
ALONE = ("tests/lab/", "tests/ranks/test_timing_truth.py", "tests/tui/test_e2e_tmux.py")


def _skip_to_failure(report, path: str) -> None:
    """Under CI=true, a skip that skips.py does not allow becomes a failure with its reason (one line)."""
    if report.skipped and not hasattr(report, "wasxfail") and isinstance(report.longrepr, tuple):
        reason = str(report.longrepr[2]).removeprefix("Skipped: ")
        line = ci_failure(path, reason)
        if line:
            report.outcome, report.longrepr = "failed", line


# The files that take longest in `make test`'s first phase, with rough seconds (setup included): from a fresh-clone
# CI run's `--durations=40`, summed per file, and for files with no line there, a run at load ~40 divided by the
# ratio test_faults.py showed between the two (4.6). Only the order matters.
# The Makefile hands files to the two workers in collection order (--no-loadscope-reorder); these go first, longest
# first, so that the two workers end together: by number of tests (pytest-xdist's default) the files of one to
# three tests, each running jobs, came last and one worker ran the last of them while the other had stopped.
# A file not named here keeps its place after them; name a new file here when it takes more than ~15 s.
SLOW_FIRST = {
    "tests/cli/test_faults.py": 150,
    "tests/cli/test_ctl_cli.py": 140,
    "tests/gpu/test_gpu_check_cpu.py": 117,
    "tests/report/test_scaling.py": 100,  # the first to ask for the smoke sweep (built_once): the others find it made
    "tests/cli/test_run_cli.py": 95,
    "tests/record/test_recording_export.py": 95,
    "tests/ranks/test_oom.py": 93,
    "tests/ranks/test_control.py": 66,
    "tests/report/test_segments.py": 65,
    "tests/record/test_recording_cli.py": 64,
    "tests/ranks/test_matrix.py": 62,
    "tests/cli/test_ctl_settings.py": 60,
    "tests/ranks/test_strategies_equal.py": 55,
    "tests/cli/test_ctrl_c.py": 45,
    "tests/security/test_terminal_safety.py": 43,
    "tests/tui/test_overview.py": 42,
    "tests/ranks/test_probes.py": 40,
    "tests/report/test_reference.py": 40,
    "tests/security/test_generic_attack.py": 36,
    "tests/report/test_report_memory.py": 32,
    "tests/cli/test_ctl_outcomes.py": 30,
    "tests/tui/test_app.py": 29,
    "tests/cli/test_help_and_data_dir.py": 28,
    "tests/cli/test_save.py": 28,
    "tests/ranks/test_training.py": 27,
    "tests/report/test_lab_recordings.py": 26,
    "tests/cli/test_disk_full_count.py": 25,
    "tests/security/test_join.py": 24,
    "tests/ranks/test_sets_during_a_pause.py": 20,
    "tests/security/test_disturbed_start.py": 19,
    "tests/ranks/test_trainer_equivalence.py": 18,
    "tests/record/test_recording_crash.py": 16,
}


def _slow_first(items: list, root: str) -> None:
    """Sorts the collected tests so that SLOW_FIRST's files come first, longest first; each file's own order kept."""
    def rank(item) -> float:
        return -SLOW_FIRST.get(os.path.relpath(str(item.path), root), 0)

    items.sort(key=rank)  # stable: the other files and every file's tests keep their order


def pytest_collection_modifyitems(config, items):
    root = str(config.rootpath)
    for item in items:
        path = os.path.relpath(str(item.path), root)
        if path.startswith(ALONE):
            item.add_marker(pytest.mark.alone)
    _slow_first(items, root)


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
