"""Under CI=true a skip fails with its one-line reason (tests/skips.py), but for tests/gpu without a GPU; without CI
it stays a skip. Real pytest runs of the real test files on a PATH without tmux, ip, tc and setpriv: the e2e test
and the lab tests, whose own checks (tests/labs.py, ddptop/lab/netns.py) find the tools missing."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import torch

from skips import GPU_SKIP

REPO = Path(__file__).resolve().parents[2]
HIDDEN = ("tmux", "ip", "tc", "setpriv")
MISSING = {"test_e2e_tmux": "tmux is not installed", "test_links": "iproute2's ip and tc", "test_refusals": "setpriv",
           "test_cuda": GPU_SKIP}


def path_without(folder: Path, hidden: tuple[str, ...]) -> str:
    """A folder of links to every command on PATH but `hidden`: the machine as if those were not installed."""
    folder.mkdir()
    for where in os.environ["PATH"].split(os.pathsep):
        for name in os.listdir(where) if os.path.isdir(where) else ():
            if name not in hidden and not os.path.lexists(folder / name):
                os.symlink(os.path.join(where, name), folder / name)
    return str(folder)


def run_pytest(tmp_path: Path, path: str, ci: bool) -> tuple[int, dict[str, tuple[str, str]]]:
    """pytest over the files (tests/gpu only where there is no GPU); each case's outcome and message."""
    files = ["tests/tui/test_e2e_tmux.py", "tests/lab/test_refusals.py", "tests/lab/test_links.py"]
    files += [] if torch.cuda.is_available() else ["tests/gpu/test_cuda.py"]
    report = tmp_path / f"ci-{ci}.xml"
    env = {k: v for k, v in os.environ.items()  # the run's own timeline is not this nested run's
           if not k.startswith("PYTEST_") and k not in ("CI", "DDPTOP_SUITE_TIMELINE")}
    env.update(PATH=path, PYTHONPATH=str(REPO), **({"CI": "true"} if ci else {}))
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:xdist", "-p", "no:cacheprovider",
                           "--junitxml", str(report), *files], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=120)
    cases = {}
    for case in ET.parse(report).iter("testcase"):
        kind = next((c for c in case if c.tag in ("skipped", "error", "failure")), None)
        cases[f"{case.get('classname')}.{case.get('name')}"] = (kind.tag, kind.get("message")) if kind is not None \
            else ("passed", "")
    return done.returncode, cases


def expected_reason(case: str) -> str:
    return next(reason for module, reason in MISSING.items() if f".{module}." in f".{case}")


def test_under_ci_a_missing_tool_fails_naming_it_and_only_the_gpu_skip_stands(tmp_path):
    path = path_without(tmp_path / "bin", HIDDEN)
    assert all(shutil.which(tool, path=path) is None for tool in HIDDEN) and shutil.which("ls", path=path)
    code, cases = run_pytest(tmp_path, path, ci=True)
    assert code == 1 and len(cases) >= 4, cases
    for case, (kind, message) in cases.items():
        reason = expected_reason(case)
        if reason == GPU_SKIP:
            assert kind == "skipped" and message.startswith(GPU_SKIP), (case, kind, message)
        else:
            assert kind in ("error", "failure") and "CI=true" in message and reason in message, (case, kind, message)


def test_without_ci_a_missing_tool_is_a_skip_with_its_reason(tmp_path):
    code, cases = run_pytest(tmp_path, path_without(tmp_path / "bin", HIDDEN), ci=False)
    assert code == 0 and len(cases) >= 4, cases
    for case, (kind, message) in cases.items():
        assert kind == "skipped" and expected_reason(case) in message, (case, kind, message)
