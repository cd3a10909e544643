"""Makes the shared test helpers (jobs.py, labs.py, the CLI helpers) importable from every test folder; marks the
tests that run alone and the lab's; under CI=true turns a skip into a failure."""

from __future__ import annotations

import os
import resource
import shutil
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))

import pytest  # noqa: E402

from skips import ci_failure  # noqa: E402
from terminals import servers_left  # noqa: E402

from phases import ALONE, LAB  # noqa: E402  (which files run alone, which are the lab's: one list, phases.py)


def _skip_to_failure(report, path: str) -> None:
    """Under CI=true, a skip that skips.py does not allow becomes a failure with its reason (one line)."""
    if report.skipped and not hasattr(report, "wasxfail") and isinstance(report.longrepr, tuple):
        reason = str(report.longrepr[2]).removeprefix("Skipped: ")
        line = ci_failure(path, reason)
        if line:
            report.outcome, report.longrepr = "failed", line


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


TIMELINE = os.environ.get("DDPTOP_SUITE_TIMELINE")  # a file: one line per test appended (scripts/test_timeline.py)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """With DDPTOP_SUITE_TIMELINE set: each test's worker, wall start and end, and the CPU it cost (this process's,
    and its waited-for children's, as the kernel counted them), for finding where a phase's time goes (issue 40)."""
    if not TIMELINE:
        yield
        return
    start, cpu = time.time(), time.process_time()
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    yield
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    child_cpu = after.ru_utime + after.ru_stime - children.ru_utime - children.ru_stime
    with open(TIMELINE, "a") as f:  # O_APPEND: the two workers' short lines do not interleave
        f.write(f"{os.environ.get('PYTEST_XDIST_WORKER', 'main')}\t{item.nodeid}\t{start:.3f}\t{time.time():.3f}\t"
                f"{time.process_time() - cpu:.3f}\t{child_cpu:.3f}\n")


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    outcome = yield  # a module that skips itself as a whole (pytest.skip(allow_module_level=True), importorskip)
    _skip_to_failure(outcome.get_result(), os.path.relpath(str(collector.path), str(collector.config.rootpath)))


@pytest.fixture(autouse=True)
def sigint_as_python_sets_it(request):
    """Each test starts with SIGINT as Python sets it (KeyboardInterrupt). Left ignored in this process (pytest's own
    worker: by a test, or a fixture that ran a job in-process), it would be ignored in every process the later tests
    start, since an ignored signal is inherited across fork and exec: a Ctrl-C a test sends to a job, or through tmux,
    then does nothing (five tests of one -n 2 CI run timed out so, each passing alone). Set back, and said."""
    import signal
    import warnings

    for when in ("before", "after"):
        found = signal.getsignal(signal.SIGINT)
        if found is not signal.default_int_handler:
            signal.signal(signal.SIGINT, signal.default_int_handler)
            warnings.warn(f"SIGINT was {found!r} {when} {request.node.nodeid}: set back to KeyboardInterrupt")
        if signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, []):  # a blocked signal is inherited too
            signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGINT])
            warnings.warn(f"SIGINT was blocked {when} {request.node.nodeid}: unblocked")
        if when == "before":
            yield


@pytest.fixture(scope="session", autouse=True)
def runs_dir(tmp_path_factory):
    """Every run records by default (./ddptop-runs/): the suite's runs record into a folder of their own."""
    folder = tmp_path_factory.mktemp("ddptop-runs")
    os.environ["DDPTOP_RUNS_DIR"] = str(folder)
    return folder


@pytest.fixture(scope="session", autouse=True)
def config_home(tmp_path_factory):
    """The screen keeps its preferences in the user's config folder (tui.prefs): the suite's screens read and write
    a folder of their own, so a developer's saved light theme changes no snapshot, and no test changes theirs."""
    folder = tmp_path_factory.mktemp("config-home")
    os.environ["XDG_CONFIG_HOME"] = str(folder)
    os.environ.pop("DDPTOP_THEME", None)
    return folder


@pytest.fixture(scope="session", autouse=True)
def no_tmux_server_left():
    """The tests that drive a terminal each start a tmux server of their own (terminals.py) and kill it: none is
    left when this pytest process ends (one that is, is killed, and the session ends in an error naming it)."""
    yield
    if shutil.which("tmux") is None:
        return
    left = servers_left()  # and killed
    assert not left, f"tmux servers the suite left running: {left}"
