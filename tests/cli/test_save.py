"""`--save FILE`: refused before training where no file can be made, written without following a link planted
during the run, and on a full disk the model is kept elsewhere with one line (exit 6), never lost.

Real parts: a real 2-rank job (one, with a symlink planted at FILE while it trains), real tmpfs mounts (as root),
/proc/self (a folder where no file can be created). Before the fix torch.save(FILE) followed the link and
overwrote its target, and a full disk or /proc/self lost the model after the whole run with exit 70.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sqlite3
import subprocess
import sys
import time

import pytest

from jobs import killed_if_left

DDPTOP = [sys.executable, "-m", "ddptop"]
TINY = ["--headless", "--local", "2", "--model", "tiny", "--synthetic-size", "640", "--batch-size", "16", "--no-eval",
        "--backend", "gloo"]
root_only = pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")


@contextlib.contextmanager
def tmpfs(folder, *options: str):
    folder.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", ",".join(("size=64k", *options)), "tmpfs", str(folder)], check=True)
    try:
        yield folder
    finally:
        subprocess.run(["umount", str(folder)], check=True)


def one_line(run: subprocess.CompletedProcess, code: int, *words: str) -> None:
    assert run.returncode == code, run.stdout + run.stderr
    lines = [line for line in run.stderr.splitlines() if line.startswith("ddptop:")]
    assert len(lines) == 1 and all(w in lines[0] for w in words), run.stderr
    assert "Traceback" not in run.stderr and "joined" not in run.stdout  # refused before any rank started


@pytest.mark.parametrize("where", ["proc", "read-only"])
@root_only
def test_save_where_no_file_can_be_made_is_refused_before_training(where, tmp_path):
    if where == "proc":
        run = subprocess.run([*DDPTOP, *TINY, "--steps", "2", "--save", "/proc/self/model.pt"], capture_output=True,
                             text=True, timeout=120)
        one_line(run, 2, "--save /proc/self/model.pt: cannot write in /proc/")
        return
    with tmpfs(tmp_path / "ro", "ro") as folder:
        run = subprocess.run([*DDPTOP, *TINY, "--steps", "2", "--save", str(folder / "model.pt")], capture_output=True,
                             text=True, timeout=120)
    one_line(run, 2, f"cannot write in {folder}: Read-only file system")


@root_only
def test_a_full_disk_keeps_the_model_in_the_runs_folder(tmp_path, monkeypatch):
    """save() itself on a 64 KB tmpfs (the tiny model's state is ~90 KB): one SaveFailed line naming where the
    model went; that file loads and equals the state; nothing half-written is left on the full disk."""
    import torch

    from ddptop.train.models import build_model
    from ddptop.train.save import SaveFailed, save

    runs = tmp_path / "runs"
    runs.mkdir()
    monkeypatch.setenv("DDPTOP_RUNS_DIR", str(runs))
    state = build_model("tiny").state_dict()
    with tmpfs(tmp_path / "full") as folder:
        with pytest.raises(SaveFailed) as failed:
            save(state, str(folder / "model.pt"))
        assert os.listdir(folder) == []
    message = str(failed.value)
    assert message.startswith(f"--save {folder / 'model.pt'} failed (No space left on device); the model is kept at "
                              f"{runs}/"), message
    kept = message.rsplit(" ", 1)[1]
    assert os.listdir(runs) == [os.path.basename(kept)] and "\n" not in message
    loaded = torch.load(kept, weights_only=True)
    assert loaded.keys() == state.keys() and all(torch.equal(loaded[k], state[k]) for k in state)


def test_a_link_planted_at_the_file_during_the_run_is_replaced_not_written_through(tmp_path):
    """The name is free at the start; while the ranks train, FILE becomes a symlink to a precious file. At the end
    the precious file is untouched and FILE is a regular file whose parameters hash to rank 0's fingerprint."""
    import torch

    from ddptop.train.models import build_model

    saved, victim, record = tmp_path / "model.pt", tmp_path / "precious", tmp_path / "run.db"
    victim.write_bytes(b"precious bytes\n")
    job = subprocess.Popen([*DDPTOP, *TINY, "--steps", "8", "--log-every", "1", "--save", str(saved), "--record",
                            str(record)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           env={**os.environ, "DDPTOP_TEST_MODEL": "sleep-ms=150"})
    with killed_if_left(job):
        for line in job.stdout:  # the first step line: the ranks train, the name was checked long ago
            if line.startswith("step 1/"):
                break
        os.symlink(victim, saved)
        planted = time.monotonic()
        out, err = job.communicate(timeout=120)
    assert job.returncode == 0, err
    assert time.monotonic() - planted > 0.5  # planted well before the end (7 steps of ≥ 150 ms were left)
    assert victim.read_bytes() == b"precious bytes\n"
    assert not saved.is_symlink() and saved.is_file()
    state = torch.load(saved, map_location="cpu", weights_only=True)
    digest = hashlib.sha256()
    for name, _ in build_model("tiny").named_parameters():  # README: raw bytes, named_parameters() order
        # the test's sleep wraps the model (models.SleepBefore): its names start with "model."
        digest.update(state["model." + name].contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    with sqlite3.connect(record) as db:
        finished = [json.loads(data) for (data,) in db.execute("SELECT data FROM events WHERE kind = 'run_finished'")]
    db.close()
    assert {f["rank"]: f["fingerprint"] for f in finished}[0] == digest.hexdigest()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temporary file left
