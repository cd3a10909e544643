"""`--record FILE` on a real run, then `ddptop info`, `export` and `replay --headless` on it and on the shipped ones."""

from __future__ import annotations

import glob
import json
import os
import shutil
import sqlite3
import subprocess
import sys

import pytest

from ddptop.cli import main
from ddptop.record.reader import Recording

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SHIPPED = sorted(glob.glob(os.path.join(ROOT, "recordings", "*.db")) + glob.glob(os.path.join(ROOT, "recordings", "*", "*.db")))
TINY = ["--headless", "--local", "2", "--model", "tiny", "--synthetic-size", "640", "--batch-size", "16", "--no-eval",
        "--backend", "gloo"]


def ddptop(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ddptop", *args], capture_output=True, text=True, timeout=timeout,
                          cwd=ROOT)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> tuple[str, subprocess.CompletedProcess]:
    path = str(tmp_path_factory.mktemp("cli") / "run.db")
    live = ddptop(*TINY, "--steps", "12", "--strategy", "allreduce", "--log-every", "4", "--record", path)
    assert live.returncode == 0, live.stderr
    return path, live


def test_replay_headless_prints_what_the_live_run_printed(recorded):
    path, live = recorded
    replay = ddptop("replay", path, "--headless", "--instant", "--log-every", "4")
    assert replay.returncode == 0, replay.stderr
    printed, closing = live.stdout.split("recorded ")  # the live run ends saying where its recording is
    assert closing.startswith(f"12 steps of 2 ranks to {path}\n") and f"ddptop report {path} -o " in closing
    assert replay.stdout == printed
    assert "step 12/12 loss" in replay.stdout and "finished: 12 steps on 2 ranks (done)" in replay.stdout
    timed = ddptop("replay", path, "--headless", "--speed", "16", "--log-every", "4")
    assert timed.returncode == 0 and timed.stdout == printed, timed.stderr


def test_info_says_what_ran_where_and_for_how_long(recorded, capsys):
    path, _ = recorded
    assert main(["info", path]) == 0
    out = capsys.readouterr().out
    assert verdict_line(out) == f"recording  {path} ({os.path.getsize(path) / 1e6:.2f} MB, schema 2, complete)"
    assert "tiny" in out and "2 ranks" in out and "steps 0-11" in out
    assert "allreduce batch=16" in out and "torch" in out
    assert main(["info", path, "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    (segment,) = info["segments"]
    assert segment["config"]["strategy"] == "allreduce" and segment["step_s_slowest"] > 0 and info["world_size"] == 2
    with Recording.open(path) as rec:
        assert rec.meta["config"]["sync"]["strategy"] == "allreduce" and rec.meta["rendezvous"]["source"] == "local"
        assert "--record" in rec.meta["argv"]


def verdict_line(out: str) -> str:
    """info's first line: the file, its size and schema, and `complete` or `incomplete: <reasons>`."""
    return out.splitlines()[0]


def test_info_names_each_ranks_missing_steps(recorded, tmp_path, capsys):
    """Steps deleted from a real recording with SQL: info says which, per rank, in the verdict line."""
    path, _ = recorded
    holed = str(tmp_path / "holed.db")
    shutil.copy(path, holed)
    with sqlite3.connect(holed) as db:
        db.execute("DELETE FROM steps WHERE (rank = 1 AND step BETWEEN 3 AND 5) OR (rank = 1 AND step = 8) "
                   "OR (rank = 0 AND step >= 10)")
    db.close()
    assert main(["info", holed]) == 0
    size = os.path.getsize(holed) / 1e6
    assert verdict_line(capsys.readouterr().out) == (f"recording  {holed} ({size:.2f} MB, schema 2, incomplete: "
                                                     "rank 0 missing steps 10-11; rank 1 missing steps 3-5, 8)")


def test_record_refuses_an_existing_file_before_starting(recorded):
    path, _ = recorded
    before = os.path.getmtime(path)
    result = ddptop(*TINY, "--steps", "2", "--record", path)
    assert result.returncode == 6 and "already exists" in result.stderr.splitlines()[-1]
    assert "joined" not in result.stdout and os.path.getmtime(path) == before


def test_a_default_name_another_run_took_meanwhile_moves_to_the_next(tmp_path):
    """Two runs started in the same second choose the same default name; the file is created exclusively, so the
    one that comes second records to the next name instead of failing (once: exit 6, "already exists")."""
    taken = tmp_path / "20990101-000000-allreduce.db"
    taken.write_bytes(b"another run's")
    script = ("import sys, ddptop.record.paths as r; chosen = sys.argv.pop(1); "
              "r.default_path = lambda *a, **k: chosen; "
              "from ddptop.cli import main; raise SystemExit(main(sys.argv[1:]))")
    run = subprocess.run([sys.executable, "-c", script, str(taken), *TINY, "--steps", "3", "--strategy", "allreduce"],
                         capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert run.returncode == 0, run.stderr
    assert taken.read_bytes() == b"another run's"  # never touched
    moved = tmp_path / "20990101-000000-allreduce-2.db"
    assert f"recording to {moved}" in run.stderr and f"to {moved}" in run.stdout
    with Recording.open(str(moved)) as rec:
        assert rec.complete and len([e for e in rec.events() if type(e).__name__ == "StepDone"]) == 6


def test_bad_replay_flags(recorded, capsys):
    path, _ = recorded
    assert main(["replay", path, "--headless", "--speed", "40"]) == 2
    assert "--speed must be between 0.5 and 16" in capsys.readouterr().err


@pytest.mark.skipif(not SHIPPED, reason="no recordings/*.db in this checkout")
@pytest.mark.parametrize("path", SHIPPED, ids=os.path.basename)
def test_shipped_recordings_open_export_and_replay(path, tmp_path, capsys):
    assert os.path.getsize(path) < 8e6
    assert main(["info", path]) == 0
    assert verdict_line(capsys.readouterr().out).endswith(", complete)")
    trace = tmp_path / "t.json"
    assert main(["export", path, "--chrome-trace", str(trace), "--csv", str(tmp_path / "csv")]) == 0
    with Recording.open(path) as rec:
        ranks = {d.rank for d in rec.step_events()}
    assert {e["pid"] for e in json.loads(trace.read_text())["traceEvents"] if e["ph"] == "X"} == ranks
    assert main(["replay", path, "--headless", "--instant"]) == 0
    assert "finished:" in capsys.readouterr().out


def test_shipped_recordings_are_documented():
    readme = open(os.path.join(ROOT, "recordings", "README.md")).read()
    assert SHIPPED and all(os.path.basename(p) in readme for p in SHIPPED)
