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
import re
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


def parameters_digest(saved) -> str:
    """README's fingerprint, made here: sha256 over the parameters' raw bytes in named_parameters() order."""
    import torch

    from ddptop.train.models import build_model

    state = torch.load(saved, map_location="cpu", weights_only=True)
    prefix = "model." if any(k.startswith("model.") for k in state) else ""  # the test's sleep wraps the model
    digest = hashlib.sha256()
    for name, _ in build_model("tiny").named_parameters():
        digest.update(state[prefix + name].contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def rank0_fingerprint(record) -> str:
    with sqlite3.connect(record) as db:
        finished = [json.loads(data) for (data,) in db.execute("SELECT data FROM events WHERE kind = 'run_finished'")]
    db.close()
    return {f["rank"]: f["fingerprint"] for f in finished}[0]


@root_only
def test_a_full_disk_keeps_the_model_in_the_runs_folder(tmp_path):
    """The real command on a 64 KB tmpfs (the tiny model's state is ~90 KB): the name is free and writable at the
    start, the write fails at the end. Exit 6, rank 0's one line naming where the model went and the front's
    closing line; that file holds the model the run trained (its parameters hash to rank 0's recorded
    fingerprint); nothing half-written is left on the full disk."""
    runs, record = tmp_path / "runs", tmp_path / "run.db"
    runs.mkdir()
    with tmpfs(tmp_path / "full") as folder:
        run = subprocess.run([*DDPTOP, *TINY, "--steps", "2", "--record", str(record), "--save",
                              str(folder / "model.pt")], capture_output=True, text=True, timeout=180,
                             env={**os.environ, "DDPTOP_RUNS_DIR": str(runs)})
        left = os.listdir(folder)
    assert run.returncode == 6 and "Traceback" not in run.stderr, run.stdout + run.stderr
    said = [line for line in run.stderr.splitlines() if "--save" in line]  # rank 0's one line saying where
    assert len(said) == 1, run.stderr
    assert said[0].startswith(f"ddptop rank 0: --save {folder / 'model.pt'} failed (No space left on device); the "
                              f"model is kept at {runs}/"), said
    # then the front's closing line, the job's exit code (README: exit 6)
    assert re.search(r"^ddptop: the job failed: rank 0 process \d+ exited with code 6 \(exit code 6\)$",
                     run.stderr, re.M), run.stderr
    assert left == []
    kept = said[0].rsplit(" ", 1)[1]
    assert os.listdir(runs) == [os.path.basename(kept)]
    assert parameters_digest(kept) == rank0_fingerprint(record)


def test_a_link_planted_at_the_file_during_the_run_is_replaced_not_written_through(tmp_path):
    """The name is free at the start; while the ranks train, FILE becomes a symlink to a precious file. At the end
    the precious file is untouched and FILE is a regular file whose parameters hash to rank 0's fingerprint."""
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
    assert parameters_digest(saved) == rank0_fingerprint(record)
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temporary file left
