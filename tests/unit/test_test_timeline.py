"""The suite's timeline (issue 40: where a phase's wall time goes): with DDPTOP_SUITE_TIMELINE set, tests/conftest.py
appends one line per test, and scripts/test_timeline.py sums each worker's busy time and each file's. Checked on a
pytest run of two files whose tests sleep a known time and burn a known amount of CPU in a child process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SLOW = '''
import time
def test_sleeps():
    time.sleep(0.6)
'''
BURN = '''
import subprocess, sys
def test_child_burns_cpu():
    subprocess.run([sys.executable, "-c", "import time\\nt = time.process_time()\\nwhile time.process_time() - t < 0.5: pass"], check=True)
def test_quick():
    pass
'''


def test_each_worker_and_file_is_summed(tmp_path):
    tests = tmp_path / "tests"
    tests.mkdir()
    (tests / "conftest.py").write_text((ROOT / "tests" / "conftest.py").read_text())
    for helper in ("skips.py", "terminals.py", "phases.py"):
        (tests / helper).write_text((ROOT / "tests" / helper).read_text())
    (tests / "test_slow.py").write_text(SLOW)
    (tests / "test_burn.py").write_text(BURN)
    timeline = tmp_path / "timeline.tsv"
    env = {**os.environ, "DDPTOP_SUITE_TIMELINE": str(timeline)}
    env.pop("PYTEST_XDIST_WORKER", None)
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                          "tests"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    rows = [line.split("\t") for line in timeline.read_text().splitlines()]
    by_test = {r[1]: r for r in rows}
    assert set(by_test) == {"tests/test_slow.py::test_sleeps", "tests/test_burn.py::test_child_burns_cpu",
                            "tests/test_burn.py::test_quick"}
    slept = by_test["tests/test_slow.py::test_sleeps"]
    assert float(slept[3]) - float(slept[2]) >= 0.6  # the wall clock of the sleep
    burned = by_test["tests/test_burn.py::test_child_burns_cpu"]
    assert float(burned[5]) >= 0.45  # the child's CPU, as the kernel counted it for the waited-for child
    summary = subprocess.run([sys.executable, str(ROOT / "scripts" / "test_timeline.py"), str(timeline)],
                             capture_output=True, text=True, timeout=60)
    assert summary.returncode == 0, summary.stderr
    assert "| main | 3 |" in summary.stdout
    files = {line.split(" | ")[0][2:]: line.split(" | ")[1:] for line in summary.stdout.splitlines()
             if line.startswith("| tests/")}
    assert files["tests/test_slow.py"][0] == "1" and float(files["tests/test_slow.py"][1]) >= 0.6
    assert files["tests/test_burn.py"][0] == "2" and float(files["tests/test_burn.py"][2].rstrip(" |")) >= 0.45
    bad = tmp_path / "bad.tsv"
    bad.write_text("not a timeline\n")
    refused = subprocess.run([sys.executable, str(ROOT / "scripts" / "test_timeline.py"), str(bad)],
                             capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1 and "cannot read" in refused.stderr
