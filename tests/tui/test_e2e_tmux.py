"""End to end, as a user: the real app with 2 local ranks in tmux; change the bucket size, the batch size and the
strategy in the controls, read their effect in the overview's segment table, pause and resume with space, quit with
q. The recording the screen named exists, says both ranks switched (and paused) at the same step each time with the
same model, ran the buckets and batches asked for, and `ddptop report` makes a report of it; no process is left.
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

from procs import rank_processes
from terminals import Tmux

import json
import sqlite3

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed (apt-get install tmux)")


_tmux = Tmux("e2e")  # a server of this test's own, killed at its end
DONE = "ddptop-test-shell-went-on"  # the shell's line once ddptop exited: all it drew is on the screen before it


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
               f"echo $? > {status}; echo {DONE}; sleep 30")
    _tmux("new-session", "-d", "-s", name, "-x", "160", "-y", "48", command)
    _tmux("set-option", "-t", name, "window-size", "manual", check=False)
    _tmux("resize-window", "-t", name, "-x", "160", "-y", "48", check=False)
    try:
        screen = _wait_for(name, " running · step ", 90)
        assert re.search(r"rec ● (\S+\.db)", screen), screen
        shown = re.search(r"rec ● (\S+\.db)", screen).group(1)  # the header names the recording
        assert shown.startswith("runs/")  # the default file in the runs folder, said relative to where ddptop ran
        shell = int(_tmux("list-panes", "-t", name, "-F", "#{pane_pid}").split()[0])
        front = _children(shell)[0]
        ranks = [p.pid for p in rank_processes(front)]
        assert len(ranks) >= 2
        _tmux("send-keys", "-t", name, "7")
        _wait_for(name, "Change the running job", 10)
        clear = ["End", *["BSpace"] * 6]
        # enter in a number field applies the form. Each field is reached by Tabs until it is drawn focused and
        # the form previews the edit before the Enter: under load a "0.02" typed as the panel opened once reached
        # the app (its digit keys pick tabs) instead of the field
        _type_into(name, "bucket MB", [*clear, "0.02"], "Apply sends {'bucket_mb': 0.02}")
        _apply(name, ["Enter"], 1)  # bucket MB 25 → 0.02
        _type_into(name, "batch size", [*clear, "8"], "Apply sends {'batch_size': 8}")
        _apply(name, ["Enter"], 2)  # batch: 16 → 8
        # ddp → allreduce, then enter in accum (a number field) applies the form. Tabs are not counted here: in two
        # CI runs under load six Tabs after the strategy list closed reached scale_lr, not accum (the Enter toggled
        # it: 'Apply sends {'strategy': 'allreduce', 'scale_lr': True}'), once even after the form showed the edit
        _keys(name, [*["BTab"] * 3, "Enter"])
        _wait_for(name, "gather-scatter", 10)  # the strategy list is open
        _keys(name, ["Up", "Enter"])
        _wait_for(name, "Apply sends {'strategy': 'allreduce'}", 10)
        _tab_to(name, "accum")
        _apply(name, ["Enter"], 3)
        _tmux("send-keys", "-t", name, "Escape")  # out of the form: keys reach the app again (space: pause)
        time.sleep(0.5)  # an escape followed at once by `1` reads as alt+1
        _tmux("send-keys", "-t", name, "1")  # the overview: the new segment's row fills in as it is measured
        row = re.compile(r"^ *▶3 +\d+-\d+ +allreduce batch=8 lr=0\.1 +\d+\.\d{3} +\d+\.\d{3} +\d+ ", re.M)
        deadline = time.monotonic() + 60
        while not row.search(_screen(name)) and time.monotonic() < deadline:
            time.sleep(0.5)
        screen = _screen(name)
        assert row.search(screen), screen
        for seg, config in ((0, r"ddp bucket=25MB batch=16"), (1, r"ddp bucket=0\.02MB batch=16"),
                            (2, r"ddp bucket=0\.02MB batch=8")):
            assert re.search(rf"^ +{seg} +\d+-\d+ +{config} lr=0\.1 +\d+\.\d{{3}}", screen, re.M), screen
        _tmux("send-keys", "-t", name, "Space")  # pause: every rank holds at one step until space again
        held = int(re.search(r"paused · step (\d+)", _wait_for(name, "paused · step ", 30)).group(1))
        time.sleep(1.5)
        assert re.search(r"paused · step (\d+)", _screen(name)).group(1) == str(held)
        _tmux("send-keys", "-t", name, "Space")
        _wait_for(name, "running · step ", 30)
        _tmux("send-keys", "-t", name, "q")
        deadline = time.monotonic() + 60
        while not status.exists() and time.monotonic() < deadline:
            time.sleep(0.3)
        assert status.read_text().strip() == "0"
        deadline = time.monotonic() + 5  # under load (average 18) a rank was once still exiting as the shell went on
        while [pid for pid in [front, *ranks] if _alive(pid)] and time.monotonic() < deadline:
            time.sleep(0.2)
        left = [pid for pid in [front, *ranks] if _alive(pid)]
        assert not left, [open(f"/proc/{pid}/cmdline").read().replace("\0", " ")[:200] for pid in left]
        after = _wait_for(name, DONE, 10)
    finally:
        _tmux.kill()
    said = re.search(r"recorded (\d+) steps of 2 ranks to (\S+)", after)
    assert said, after
    path = os.path.join(tmp_path, said.group(2))
    assert os.path.samefile(path, os.path.join(tmp_path, shown)) and os.path.dirname(path) == str(runs)
    assert f"ddptop report {said.group(2)} -o " in after
    _check_recording(path)
    report = subprocess.run([sys.executable, "-m", "ddptop", "report", path, "-o", str(tmp_path / "report"),
                             "--formats", "png"], capture_output=True, text=True, timeout=180)
    assert report.returncode == 0, report.stderr
    text = (tmp_path / "report" / "report.md").read_text()
    assert "allreduce" in text and "ddp" in text


def _keys(name: str, keys: list[str]) -> None:
    for key in keys:
        _tmux("send-keys", "-t", name, *(["-l", key] if key[0].isdigit() else [key]))
        time.sleep(0.3)


FIELD = re.compile(r"(strategy|bucket MB|async_op|batch size|lr warm-up|lr|scale_lr|accum|compress) {2,}")


def _form(name: str) -> dict[str, str]:
    """The controls' field lines as the terminal draws them (capture-pane -e: with their attributes), by label."""
    out: dict[str, str] = {}
    for line in _tmux("capture-pane", "-e", "-p", "-t", name).splitlines():
        found = FIELD.match(re.sub(r"\x1b\[[0-9;]*m", "", line).strip())
        if found:
            out.setdefault(found.group(1), line)
    return out


def _focused(form: dict[str, str]) -> frozenset[str]:
    """The labels of the fields drawn bold (the focused one)."""
    return frozenset(label for label, line in form.items() if "\x1b[1m" in line)


def _tab_to(name: str, label: str) -> None:
    """Tab until the number field `label` is drawn focused (bold). Each Tab waits until the app has moved the focus
    (another field drawn bold, or the form gone) before the next: a wait for any change of the form let a second Tab
    go before the first was handled (a focused field's cursor blinks, which changes its line), and under load
    (ci14, two busy loops beside the suite) the Tabs piled up in the app, walked past the form and cycled the panels
    to the Overview. A Tab that reached the app instead of the form (the form lost the focus as the strategy list
    closed) picks the next panel: back to the controls (7) first, whose form keeps its edits."""
    for _ in range(12):
        if not _form(name):  # no field drawn: another panel (a 7 typed into a drawn form would be a digit)
            _tmux("send-keys", "-t", name, "7")
            _wait_for(name, "Change the running job", 10)
        form = _form(name)
        if label in _focused(form):
            return
        _keys(name, ["Tab"])
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            now = _form(name)
            if not now or _focused(now) != _focused(form):
                break
            time.sleep(0.2)
    raise AssertionError(f"{label} never had the focus:\n{_screen(name)}")


def _type_into(name: str, label: str, keys: list[str], preview: str) -> None:
    """Type `keys` into the number field `label` until the form previews the edit. Under load (a CI run, -n 2) the
    field was once drawn focused and the digits still reached the app (they pick panels: "0.02" opened Ranks): then
    back to the controls (7) and again, at most three times."""
    for attempt in range(3):
        if "Change the running job" not in _screen(name):
            _tmux("send-keys", "-t", name, "7")
            _wait_for(name, "Change the running job", 10)
        _tab_to(name, label)
        _keys(name, keys)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            if preview in _screen(name):
                return
            time.sleep(0.3)
    raise AssertionError(f"{preview!r} never appeared; the screen was:\n{_screen(name)}")


def _apply(name: str, keys: list[str], segment: int) -> None:
    """Type `keys` into the controls, see the change applied as `segment`, then let it run 6 steps (a sampled one)."""
    _keys(name, keys)
    screen = _wait_for(name, f"(segment {segment}) on every rank", 60)
    k = int(re.search(rf"applied at step (\d+) \(segment {segment}\)", screen).group(1))
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        now = re.search(r"running · step (\d+)", _screen(name))
        if now and int(now.group(1)) >= k + 6:
            return
        time.sleep(0.3)
    raise AssertionError(f"segment {segment} never ran 6 steps:\n{_screen(name)}")


def _check_recording(path: str) -> None:
    """SQL on the file: each change the screen made is a segment that both ranks started at one step with one model,
    whose steps ran its batch size, and whose sampled steps ran its collectives (DDP at 0.02 MB: the tiny model's
    83.9 KB in two buckets, at 25 MB in one)."""
    from ddptop.record.reader import Recording

    with Recording.open(path) as rec:
        assert rec.complete
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        switched = {}
        for (data,) in db.execute("SELECT data FROM events WHERE kind = 'config_applied'"):
            e = json.loads(data)
            assert e["who"] == "start" or e["who"].startswith("tui@"), e["who"]
            switched.setdefault(e["segment"], {})[e["rank"]] = (e["step"], e["fingerprint"], e["config"])
        wanted = {1: ("ddp", 0.02, 16), 2: ("ddp", 0.02, 8), 3: ("allreduce", 0.02, 8)}
        assert sorted(switched) == [0, 1, 2, 3]
        for seg, by_rank in switched.items():
            assert sorted(by_rank) == [0, 1] and by_rank[0] == by_rank[1], seg  # one step, one model, one config
            config = by_rank[0][2]
            if seg in wanted:
                assert (config["strategy"], config["bucket_mb"], config["batch_size"]) == wanted[seg], seg
        starts = sorted((by_rank[0][0], seg) for seg, by_rank in switched.items())
        for rank, step, seg, batch in db.execute("SELECT rank, step, segment, batch_size FROM steps"):
            in_force = max(s for start, s in starts if start <= step)
            assert (seg, batch) == (in_force, switched[in_force][0][2]["batch_size"]), (rank, step)
        buckets = {}
        for seg, spans in db.execute("SELECT s.segment, s.spans FROM spans s JOIN segments g ON g.segment = s.segment "
                                     "WHERE s.step > g.step"):
            buckets.setdefault(seg, set()).update(n for kind, n, *_ in json.loads(spans) if kind == "comm")
        assert buckets[0] == {"bucket 0"} and buckets[1] == buckets[2] == {"bucket 0", "bucket 1"}, buckets
        assert "allreduce classifier.weight" in buckets[3]
        states = [json.loads(d) for (d,) in db.execute("SELECT data FROM events WHERE kind = 'run_state'")]
        assert sorted((e["rank"], e["paused"]) for e in states) == [(0, False), (0, True), (1, False), (1, True)]
        assert len({e["step"] for e in states}) == 1  # paused and resumed at one step boundary on both ranks
    finally:
        db.close()
