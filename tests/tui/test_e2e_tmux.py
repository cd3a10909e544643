"""End to end, as a user: the real app with 2 local ranks in tmux; switch the strategy in the controls, read its
effect in the overview's segment table, quit with q. The recording the screen named exists, says both ranks
switched at the same step, and `ddptop report` makes a report of it; no process of the run is left.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import time

import pytest

from ddptop.events import ConfigApplied
from ddptop.events import StepDone

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed (apt-get install tmux)")


def _tmux(*args: str) -> str:
    return subprocess.run(["tmux", *args], capture_output=True, text=True, check=True).stdout


def _screen(name: str) -> str:
    return _tmux("capture-pane", "-p", "-t", name)


def _wait_for(name: str, text: str, timeout_s: float) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        screen = _screen(name)
        if text in screen:
            return screen
        time.sleep(0.3)
    raise AssertionError(f"{text!r} never appeared; the screen was:\n{_screen(name)}")


def _children(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


def test_switch_strategy_then_read_it_on_the_overview_quit_and_report_the_recording(tmp_path):
    name = f"ddptop-e2e-{os.getpid()}"
    runs, status = tmp_path / "runs", tmp_path / "exit"
    # a tmux server started earlier keeps its own environment: say what this ddptop needs; start it once the
    # window has its size
    command = (f"sleep 1; cd {tmp_path} && PYTHONPATH={shlex.quote(os.environ.get('PYTHONPATH', REPO))} "
               f"DDPTOP_RUNS_DIR={runs} OMP_NUM_THREADS=1 {sys.executable} -m ddptop --local 2 --backend gloo "
               f"--model tiny --steps 100000 --synthetic-size 640 --batch-size 16 --no-eval --span-every 5; "
               f"echo $? > {status}; sleep 30")
    _tmux("new-session", "-d", "-s", name, "-x", "160", "-y", "48", command)
    subprocess.run(["tmux", "set-option", "-t", name, "window-size", "manual"], capture_output=True)
    subprocess.run(["tmux", "resize-window", "-t", name, "-x", "160", "-y", "48"], capture_output=True)
    try:
        screen = _wait_for(name, " running · step ", 90)
        assert re.search(r"rec ● (\S+\.db)", screen), screen
        shown = re.search(r"rec ● (\S+\.db)", screen).group(1)  # the header names the recording
        assert shown.startswith("runs/")  # the default file in the runs folder, said relative to where ddptop ran
        shell = int(_tmux("list-panes", "-t", name, "-F", "#{pane_pid}").split()[0])
        front = _children(shell)[0]
        ranks = _children(front)
        assert len(ranks) >= 2
        _tmux("send-keys", "-t", name, "7")
        _wait_for(name, "Change the running job", 10)
        for key in ("Enter", "Up", "Enter", *["Tab"] * 6, "Enter"):  # ddp → allreduce, then Apply
            _tmux("send-keys", "-t", name, key)
            time.sleep(0.4)
        screen = _wait_for(name, "applied at step", 60)
        assert "on every rank" in screen
        _tmux("send-keys", "-t", name, "1")  # the overview: the new segment's row fills in as it is measured
        row = re.compile(r"^ *▶1 +\d+-\d+ +allreduce batch=16 lr=0\.1 +\d+\.\d{3} +\d+\.\d{3} +\d+ ", re.M)
        deadline = time.monotonic() + 60
        while not row.search(_screen(name)) and time.monotonic() < deadline:
            time.sleep(0.5)
        screen = _screen(name)
        assert row.search(screen), screen
        assert re.search(r"^ +0 +\d+-\d+ +ddp bucket=25MB batch=16 lr=0\.1 +\d+\.\d{3}", screen, re.M), screen
        _tmux("send-keys", "-t", name, "q")
        deadline = time.monotonic() + 60
        while not status.exists() and time.monotonic() < deadline:
            time.sleep(0.3)
        assert status.read_text().strip() == "0"
        assert not [pid for pid in [front, *ranks] if _alive(pid)]
        after = _screen(name)
    finally:
        subprocess.run(["tmux", "kill-session", "-t", name], capture_output=True)
    said = re.search(r"recorded (\d+) steps of 2 ranks to (\S+)", after)
    assert said, after
    path = os.path.join(tmp_path, said.group(2))
    assert os.path.samefile(path, os.path.join(tmp_path, shown)) and os.path.dirname(path) == str(runs)
    assert f"ddptop report {said.group(2)} -o " in after
    _check_recording(path)
    report = subprocess.run([sys.executable, "-m", "ddptop", "report", path, "-o", str(tmp_path / "report")],
                            capture_output=True, text=True, timeout=180)
    assert report.returncode == 0, report.stderr
    text = (tmp_path / "report" / "report.md").read_text()
    assert "allreduce" in text and "ddp" in text


def _check_recording(path: str) -> None:
    from ddptop.record.reader import Recording

    with Recording.open(path) as rec:
        assert rec.complete
        events = list(rec.events())
    switches = [e for e in events if isinstance(e, ConfigApplied) and e.who.startswith("tui@")]
    assert sorted(e.rank for e in switches) == [0, 1]
    assert switches[0].step == switches[1].step and switches[0].config["strategy"] == "allreduce"
    k = switches[0].step
    steps = [e for e in events if isinstance(e, StepDone)]
    assert {e.segment for e in steps if e.step < k} == {0} and {e.segment for e in steps if e.step >= k} == {1}
