"""Ctrl-C at awkward moments (issue 26): twice 0.2 s apart on a headless run in a terminal gives one summary, one
`finished … (stopped)` line and no progress bar left after them; once before any step leaves a recording that
`info` does not call complete.

Real jobs (2 gloo ranks, the tiny model). The first runs in tmux, so the rich progress bar is on as for a user and
Ctrl-C is the terminal's own (tmux send-keys C-c: SIGINT to the foreground process group); what the terminal shows
at the end is the ground truth. The second's ground truth is the file's own steps table, read with sqlite3.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import sqlite3
import subprocess
import sys
import time

import pytest

from terminals import Tmux

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed (apt-get install tmux)")
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


tmux = Tmux("ctrl-c")  # a server of these tests' own, killed at the end of each
DONE = "ddptop-test-shell-went-on"  # the shell's line once ddptop exited: all it drew is on the screen before it


def screen(name: str) -> str:
    return tmux("capture-pane", "-p", "-J", "-S", "-200", "-t", name)


def wait_for(done, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if done():
            return True
        time.sleep(0.2)
    return False


def test_two_ctrl_cs_print_the_closing_lines_once_and_no_bar_after_them(tmp_path):
    name, status = f"ddptop-ctrlc-{os.getpid()}", tmp_path / "exit"
    command = (f"cd {tmp_path} && PYTHONPATH={shlex.quote(os.environ.get('PYTHONPATH', REPO))} {sys.executable} "
               "-m ddptop --local 2 --backend gloo --model tiny --headless --steps 100000 --synthetic-size 640 "
               f"--batch-size 16 --no-eval --log-every 1 --record run.db; echo $? > {status}; echo {DONE}; sleep 30")
    tmux("new-session", "-d", "-s", name, "-x", "200", "-y", "50", f"sleep 1; {command}")  # once it has its size
    tmux("set-option", "-t", name, "window-size", "manual", check=False)
    tmux("resize-window", "-t", name, "-x", "200", "-y", "50", check=False)
    try:
        assert wait_for(lambda: "step 2/" in screen(name), 90), screen(name)
        tmux("send-keys", "-t", name, "C-c")
        time.sleep(0.2)
        tmux("send-keys", "-t", name, "C-c")
        assert wait_for(lambda: DONE in screen(name), 60), screen(name)  # anything drawn after the exit (a bar's
        shown = screen(name)  # last refresh) is on the screen before the shell's line
    finally:
        tmux.kill()
    lines = [line.rstrip() for line in shown.splitlines() if line.strip()]
    finished = [i for i, line in enumerate(lines) if line.startswith("finished: ")]
    assert len(finished) == 1 and lines[finished[0]].endswith("(stopped)"), shown
    after = lines[finished[0] + 1:]
    assert not any("training" in line or "s/it" in line for line in after), shown  # no bar nor step line after
    assert status.read_text().strip() == "0", shown


def test_a_ctrl_c_while_the_front_tears_the_job_down_changes_nothing(tmp_path):
    """The second Ctrl-C of the test above once came after the closing lines, while the front tore the job down:
    exit 130 and `ddptop: interrupted` after a clean stop, the job file left with its token (CI, 2026-11-27). The front
    is held 3 s at the teardown's start (DDPTOP_TEST_FRONT), and a Ctrl-C is sent there."""
    name, status, jobs = f"ddptop-teardown-{os.getpid()}", tmp_path / "exit", tmp_path / "jobs"
    command = (f"cd {tmp_path} && DDPTOP_STATE_DIR={jobs} DDPTOP_TEST_FRONT=teardown:3000 "
               f"PYTHONPATH={shlex.quote(os.environ.get('PYTHONPATH', REPO))} {sys.executable} "
               "-m ddptop --local 2 --backend gloo --model tiny --headless --steps 100000 --synthetic-size 640 "
               f"--batch-size 16 --no-eval --log-every 1 --record run.db; echo $? > {status}; echo {DONE}; sleep 30")
    tmux("new-session", "-d", "-s", name, "-x", "200", "-y", "50", f"sleep 1; {command}")
    try:
        assert wait_for(lambda: "step 2/" in screen(name), 90), screen(name)
        assert len(list(jobs.iterdir())) == 1  # the job file, while the job runs
        tmux("send-keys", "-t", name, "C-c")
        assert wait_for(lambda: "finished: " in screen(name), 60), screen(name)
        tmux("send-keys", "-t", name, "C-c")  # within the 3 s hold: the teardown has not run yet
        time.sleep(0.2)
        assert not status.exists(), screen(name)  # still held when the second Ctrl-C arrived
        assert wait_for(lambda: DONE in screen(name), 60), screen(name)
        shown = screen(name)
    finally:
        tmux.kill()
    assert status.read_text().strip() == "0" and "interrupted" not in shown, shown
    (note,) = jobs.iterdir()  # the teardown ran whole: the job file became the note that the job ended, no token
    left = json.loads(note.read_text())
    assert "ended" in left and "token" not in left and left["how"].startswith("stopped"), (left, shown)
    assert shown.count("finished: ") == 1, shown


def test_a_ctrl_c_before_any_step_leaves_a_recording_info_does_not_call_complete(tmp_path):
    record = tmp_path / "run.db"
    proc = subprocess.Popen([sys.executable, "-m", "ddptop", "--local", "2", "--backend", "gloo", "--model", "tiny",
                             "--headless", "--steps", "100000", "--no-eval", "--record", str(record)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            env={**os.environ, "DDPTOP_TEST_RANK": "start=0:5000"})  # 5 s before step 0
    try:
        joined = proc.stdout.readline()  # the first rank's hello: before its first step
        assert joined.startswith("rank "), joined
        os.killpg(proc.pid, signal.SIGINT)  # the terminal's Ctrl-C: to the whole group
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0, err
    with sqlite3.connect(record) as db:
        assert db.execute("SELECT count(*) FROM steps").fetchone() == (0,)
    info = subprocess.run([sys.executable, "-m", "ddptop", "info", str(record)], capture_output=True, text=True)
    first = info.stdout.splitlines()[0]
    assert "incomplete: stopped before any step" in first, first
