"""End to end, as a user: the real app with 2 local ranks in tmux; switch the strategy in the controls, quit with q.

Then the recording says both ranks switched at the same step, and no process of the run is left.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time

import pytest

from ddptop.control.commands import ConfigApplied
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


def test_switch_strategy_in_the_ui_then_quit(tmp_path):
    name = f"ddptop-e2e-{os.getpid()}"
    record, status = tmp_path / "run.db", tmp_path / "exit"
    command = (f"cd {REPO} && OMP_NUM_THREADS=1 {sys.executable} -m ddptop --local 2 --backend gloo --model tiny --steps 100000 "
               f"--synthetic-size 640 --batch-size 16 --no-eval --span-every 5 --record {record}; "
               f"echo $? > {status}; sleep 30")
    _tmux("new-session", "-d", "-s", name, "-x", "160", "-y", "48", command)
    subprocess.run(["tmux", "resize-window", "-t", name, "-x", "160", "-y", "48"], capture_output=True)
    try:
        _wait_for(name, "running", 90)
        shell = int(_tmux("list-panes", "-t", name, "-F", "#{pane_pid}").split()[0])
        front = _children(shell)[0]
        ranks = _children(front)
        assert len(ranks) >= 2
        _tmux("send-keys", "-t", name, "6")
        _wait_for(name, "Change the running job", 10)
        for key in ("Enter", "Up", "Enter", "Tab", "Tab", "Tab", "Tab", "Enter"):  # ddp → allreduce, then Apply
            _tmux("send-keys", "-t", name, key)
            time.sleep(0.4)
        screen = _wait_for(name, "applied at step", 60)
        assert "on every rank" in screen
        _wait_for(name, "\n allreduce ", 10)  # the header's second line: the config in force
        _tmux("send-keys", "-t", name, "q")
        deadline = time.monotonic() + 60
        while not status.exists() and time.monotonic() < deadline:
            time.sleep(0.3)
        assert status.read_text().strip() == "0"
        assert not [pid for pid in [front, *ranks] if _alive(pid)]
    finally:
        subprocess.run(["tmux", "kill-session", "-t", name], capture_output=True)
    _check_recording(str(record))


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
