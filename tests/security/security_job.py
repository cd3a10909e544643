"""Shared by the security tests (not a conftest: a module name of its own, so no other folder's conftest shadows it):
a real ddptop job (front process, 2 gloo ranks, a real TCPStore) and a stranger who only knows its address."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from datetime import timedelta

import psutil

from calibrate import slowdown

os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "FATAL")  # the stranger's refused clients: no C++ traces in the log
import torch.distributed as dist  # noqa: E402
from procs import rank_processes  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "cli"))

from ddptop.control.client import ControlClient  # noqa: E402
from ddptop.control.token import running_jobs  # noqa: E402
from ddptop.errors import DdptopError  # noqa: E402
from test_run_cli import DDPTOP, TINY  # noqa: E402

TOKEN = "the-users-job-token"
LOST_AFTER_S = 4  # short, for the tests; with margin for a machine shared with other test runs


def stranger(port: int, timeout_s: float = 5.0) -> dist.Store:
    """What anyone who reaches the port can do: a plain TCPStore client under ddptop's public prefix."""
    return dist.PrefixStore("ddptop", dist.TCPStore("127.0.0.1", port, None, False, timedelta(seconds=timeout_s)))


class Job:
    """`ddptop --local 2 --headless --record R --token T`, training until stopped."""

    def __init__(self, tmp, *extra: str):
        self.env = {**os.environ, "DDPTOP_STATE_DIR": str(tmp / "jobs"), "TORCH_CPP_LOG_LEVEL": "FATAL"}
        self.record = tmp / "job.db"
        self.proc = subprocess.Popen(
            DDPTOP + ["--local", "2", "--steps", "100000", "--log-every", "100000", "--record", str(self.record),
                      "--token", TOKEN, "--lost-after", str(LOST_AFTER_S), *TINY, *extra],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=self.env, start_new_session=True)
        self.port = self._wait_training()
        self.client = ControlClient("127.0.0.1", self.port, TOKEN)
        self.kept: list = []  # sockets and clients an attack leaves open until the job ends

    def _running_jobs(self) -> list[dict]:
        """The job files in this job's state folder: running_jobs reads DDPTOP_STATE_DIR from the environment, set
        here for that read only (left set, it sent every later test on this pytest worker to this folder)."""
        before = os.environ.get("DDPTOP_STATE_DIR")
        os.environ["DDPTOP_STATE_DIR"] = self.env["DDPTOP_STATE_DIR"]
        try:
            return running_jobs()
        finally:
            if before is None:
                del os.environ["DDPTOP_STATE_DIR"]
            else:
                os.environ["DDPTOP_STATE_DIR"] = before

    def _wait_training(self, timeout: float = 90) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                jobs = self._running_jobs()
                if jobs and ControlClient("127.0.0.1", jobs[0]["port"], TOKEN).status()["step"] >= 3:
                    return jobs[0]["port"]
            except DdptopError:
                pass
            if self.proc.poll() is not None:
                raise AssertionError(self.proc.communicate())
            time.sleep(0.3)
        raise AssertionError("the job never started training")

    def step(self, rank: int = 0) -> int:
        status = self.client.status()
        return status["step"] if rank == 0 else status["ranks"][rank].get("step", -1)

    def advances(self, rank: int = 0, within_s: float = 10.0) -> float:
        """Seconds until `rank` reports a newer step (asserts it does within `within_s` times the machine's slowdown,
        calibrate.py)."""
        limit = within_s * slowdown()
        start, first = time.monotonic(), self.step(rank)
        while self.step(rank) <= first:
            assert time.monotonic() - start < limit, f"rank {rank} stopped training"
            time.sleep(0.1)
        return time.monotonic() - start

    def recorded(self, kind: str, until=lambda rows: bool(rows), within_s: float = 10.0) -> list[dict]:
        """The `data` of every `kind` event in the live recording (SQL on the file the front writes, committed
        every 0.5 s), polled until `until(rows)` or `within_s`."""
        deadline = time.monotonic() + within_s
        while True:
            db = sqlite3.connect(f"file:{self.record}?mode=ro", uri=True, timeout=5)
            try:
                rows = [json.loads(d) for (d,) in db.execute("SELECT data FROM events WHERE kind = ?", (kind,))]
            finally:
                db.close()
            if until(rows) or time.monotonic() > deadline:
                return rows
            time.sleep(0.2)

    def ranks(self) -> list[psutil.Process]:
        return rank_processes(self.proc.pid)

    def stop(self, sig=signal.SIGTERM, timeout: float = 60) -> tuple[str, str, float]:
        start = time.monotonic()
        os.kill(self.proc.pid, sig)
        try:
            out, err = self.proc.communicate(timeout=timeout)
        finally:
            if self.proc.poll() is None:
                os.killpg(self.proc.pid, signal.SIGKILL)
        return out, err, time.monotonic() - start
