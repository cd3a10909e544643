"""What a stranger on the port can still do (README: trust model): torch's own rendezvous keys (`pg/*`) cannot be
protected, so overwriting them while a job starts can stop it. It must end as README says: exit 4, every line
ddptop's own naming the cause, never MemoryError's traceback, exit 70 or a C++ message."""

from __future__ import annotations

import os
import subprocess
import time
from datetime import timedelta

os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "FATAL")  # the stranger's own refused clients: no C++ traces here
import torch.distributed as dist  # noqa: E402

import ports  # noqa: E402
from test_run_cli import DDPTOP, TINY  # noqa: E402


PG_KEYS = ("pg/0//cpu//0/0", "pg/0//cpu//0/1", "pg/0//1//cpu//0/0", "pg/0//1//cpu//0/1")


def test_garbage_in_torchs_keys_while_a_job_starts_is_one_line_each_and_exit_4(tmp_path):
    port = ports.port()
    # rank 0 held 3 s after the join, before its process group starts (a test hook): the stranger's window while
    # the job starts. Without it the start took under a second, and once (a CI run, 2026-11-27) the stranger's
    # first connect timed out past it. (The join itself is on the front's sockets: nothing of it in the store.)
    env = {**os.environ, "DDPTOP_STATE_DIR": str(tmp_path / "jobs"), "DDPTOP_TEST_RANK": "pg=0:3000"}
    job = subprocess.Popen(DDPTOP + ["--local", "2", "--port", str(port), "--steps", "20", "--token",
                                     "disturbed-start-token-0123", "--record", str(tmp_path / "run.db"), *TINY],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    raw, hits, where, deadline = None, 0, None, time.monotonic() + 90
    while job.poll() is None and time.monotonic() < deadline:
        try:  # the stranger lists the keys until rank 1's process-group key shows where they are, then overwrites
            raw = raw or dist.TCPStore("127.0.0.1", port, None, False, timedelta(seconds=2))
            where = where or next((k[:k.index("/pg/") + 1] for k in raw.list_keys() if "/pg/" in k), None)
            for name in PG_KEYS if where else ():  # torch's process-group keys for 2 gloo ranks on CPU
                raw.set(where + name, b"garbage")  # once: MemoryError std::bad_alloc, exit 70, a gloo C++ message
                hits += 1
        except Exception:  # the store is not up yet, or went away with the job
            raw = None
            time.sleep(0.02)
    out, err = job.communicate(timeout=60)
    assert hits > 0, "the attack never reached a process-group key"
    assert job.returncode == 4, err
    lines = err.strip().splitlines()
    assert all(line.startswith("ddptop") for line in lines), err  # nothing from torch, gloo or Python itself
    disturbed = [line for line in lines if "process group's start was disturbed" in line]
    assert disturbed and all("may have overwritten them" in line for line in disturbed), err
    for words in ("Traceback", "MemoryError: std", "internal error", ".cc:", ".cpp:", "terminate called"):
        assert words not in err + out, err
