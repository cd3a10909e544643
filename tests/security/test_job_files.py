"""The job file and the state folder it lives in (issue 41): a partial planted where ddptop writes the job file or
the ended note is never written through, a state folder others may enter is refused, and another user's process
is never taken for dead. Root plants as the user nobody would (links and files owned by uid 65534); the reading as
another user runs through util-linux's setpriv."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from ddptop.control import token

REPO = Path(__file__).resolve().parents[2]
NOBODY = 65534
ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="plants files as another user: needs root")
TOKEN = "a-secret-token-of-root-1234"


def _victim(folder: Path) -> Path:
    victim = folder / "victim"
    victim.write_text("root's own file\n")
    return victim


def _private(folder: Path) -> Path:
    folder.mkdir(mode=0o700)
    folder.chmod(0o700)
    return folder


def _partial_names(path: Path) -> list[Path]:
    """Where the old code wrote its partial: HOST_PORT.PID.tmp beside the file (the attack planted thousands)."""
    return [path.with_suffix(f".{os.getpid()}.tmp")]


@ROOT_ONLY
def test_a_planted_link_or_file_at_the_job_files_partial_is_never_written_through(tmp_path, monkeypatch):
    jobs = _private(tmp_path / "jobs")
    monkeypatch.setenv("DDPTOP_STATE_DIR", str(jobs))
    victim = _victim(tmp_path)
    path = token.job_file("127.0.0.1", 29599)
    (link,) = _partial_names(path)
    link.symlink_to(victim)
    os.lchown(link, NOBODY, NOBODY)
    assert token.write_job_file("127.0.0.1", 29599, TOKEN, 2) == path
    assert victim.read_text() == "root's own file\n"  # before: root's token went into the link's target
    job = json.loads(path.read_text())
    assert job["token"] == TOKEN and not path.is_symlink()
    assert (path.stat().st_uid, stat.S_IMODE(path.stat().st_mode)) == (0, 0o600)
    # a partial nobody made beforehand, readable by all: before, it became the job file, nobody's and 0666
    path.unlink()
    link.unlink()
    link.write_text("")
    link.chmod(0o666)
    os.chown(link, NOBODY, NOBODY)
    token.write_job_file("127.0.0.1", 29599, TOKEN, 2)
    assert link.read_text() == "" and link.stat().st_uid == NOBODY  # never opened
    assert (path.stat().st_uid, stat.S_IMODE(path.stat().st_mode)) == (0, 0o600)
    assert json.loads(path.read_text())["token"] == TOKEN


@ROOT_ONLY
def test_a_planted_link_at_the_ended_notes_partial_is_never_written_through(tmp_path, monkeypatch):
    jobs = _private(tmp_path / "jobs")
    monkeypatch.setenv("DDPTOP_STATE_DIR", str(jobs))
    victim = _victim(tmp_path)
    path = token.write_job_file("127.0.0.1", 29598, TOKEN, 2)
    (link,) = _partial_names(path)
    link.symlink_to(victim)
    os.lchown(link, NOBODY, NOBODY)
    token.remove_job_file("127.0.0.1", 29598, how="done after 30 steps")
    assert victim.read_text() == "root's own file\n"
    note = json.loads(path.read_text())
    assert note["how"] == "done after 30 steps" and "token" not in note and not path.is_symlink()
    assert token.last_ended_job("127.0.0.1", 29598)["how"] == "done after 30 steps"


def _ctl(env: dict, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ddptop", "ctl", *argv], capture_output=True, text=True,
                          timeout=60, env={**env, "PYTHONPATH": str(REPO)})


@ROOT_ONLY
@pytest.mark.parametrize("how", ["mode 0777", "mode 0750", "owned by nobody"])
def test_a_state_folder_others_may_enter_or_own_is_refused_in_one_line(tmp_path, how):
    """Before: the folder was used as it was (mkdir(exist_ok=True)); the token went into a file there."""
    jobs = _private(tmp_path / "jobs")
    if how.startswith("mode"):
        jobs.chmod(int(how.split()[1], 8))
    else:
        os.chown(jobs, NOBODY, NOBODY)
    env = {**os.environ, "DDPTOP_STATE_DIR": str(jobs)}
    result = _ctl(env, "status")
    assert result.returncode == 2 and result.stderr.count("\n") == 1, (result.returncode, result.stderr)
    assert f"the state folder {jobs}" in result.stderr and "chmod 700" in result.stderr, result.stderr
    run = subprocess.run([sys.executable, "-m", "ddptop", "--headless", "--local", "1", "--model", "tiny",
                          "--steps", "2", "--no-record"], capture_output=True, text=True, timeout=120,
                         env={**env, "PYTHONPATH": str(REPO)}, cwd=tmp_path)
    assert run.returncode == 2 and f"the state folder {jobs}" in run.stderr, (run.returncode, run.stderr)
    assert "rank 0 joined" not in run.stdout and list(jobs.iterdir()) == []  # refused before anything started


@ROOT_ONLY
@pytest.mark.skipif(shutil.which("setpriv") is None, reason="setpriv is not installed (apt-get install util-linux)")
def test_another_users_running_process_is_alive_so_its_job_file_stays(tmp_path):
    """`os.kill(pid, 0)` on another user's process fails with EPERM: it runs. Before, EPERM read as dead and the
    reader deleted the running job's file. The reader is uid 65533 in a folder of its own; the job's front is a
    process of uid 65534 (nobody)."""
    folder = Path(tempfile.mkdtemp(prefix="ddptop-eperm-"))  # pytest's tmp_path is root's own (0700)
    sleeper = subprocess.Popen(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "sleep", "60"])
    try:
        folder.chmod(0o755)
        jobs = _private(folder / "jobs")
        path = jobs / "127.0.0.1_29597.json"
        path.write_text(json.dumps({"master": "127.0.0.1", "port": 29597, "token": TOKEN, "world_size": 2,
                                    "pid": sleeper.pid, "prefix": ""}))
        for p in (jobs, path):
            os.chown(p, 65533, 65533)
        code = "from ddptop.control.token import running_jobs; print([j['pid'] for j in running_jobs()])"
        result = subprocess.run(["setpriv", "--reuid=65533", "--regid=65533", "--clear-groups", sys.executable, "-c",
                                 code], capture_output=True, text=True, timeout=60,
                                env={**os.environ, "PYTHONPATH": str(REPO), "DDPTOP_STATE_DIR": str(jobs)})
        assert result.returncode == 0, result.stderr
        assert result.stdout.strip() == f"[{sleeper.pid}]" and path.exists(), (result.stdout, result.stderr)
    finally:
        sleeper.kill()
        sleeper.wait()
        shutil.rmtree(folder)
