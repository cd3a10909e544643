"""The report tests' recordings: a real smoke sweep, and a real job switched live so that one segment is short."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from ddptop.cli import main
from ddptop.control.client import ControlClient

from built_once import built_once
from jobs import killed_if_left
import ports
from smoke_run import record_smoke

TOKEN = "report-test-token"


@pytest.fixture(scope="session")
def smoke(tmp_path_factory):
    """The smoke sweep and its report, made once for every worker (five test files on both read it)."""
    return built_once(tmp_path_factory, "smoke", _smoke)


def _smoke(folder):
    record = record_smoke(folder)
    out = folder / "report"
    assert main(["report", str(record), "-o", str(out)]) == 0
    return record, out


@pytest.fixture(scope="session")
def switched(tmp_path_factory):
    """A tiny job on 2 ranks, each step slowed by 150 ms so that every switch lands within a step or two:
    allreduce for ~15 steps, then gather-scatter asked for and, as soon as it is applied, ddp: gather-scatter runs
    only 2-3 steps, fewer than warm-up 1 + 3. Returns (recording, [(changes, applied answer), ...])."""
    folder = tmp_path_factory.mktemp("switched")
    record, port = folder / "switched.db", ports.port()
    env = {**os.environ, "DDPTOP_TEST_MODEL": "sleep-ms=150"}
    job = subprocess.Popen([sys.executable, "-m", "ddptop", "--headless", "--local", "2", "--model", "tiny",
                            "--strategy", "allreduce", "--batch-size", "16", "--synthetic-size", "1600",
                            "--steps", "36",
                            "--span-every", "5", "--port", str(port), "--token", TOKEN, "--record", str(record)],
                           env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    answers = []
    with killed_if_left(job):
        client = _connect(port, job)
        while client.status().get("step", 0) < 14:
            time.sleep(0.1)
        for changes in ({"strategy": "gather-scatter"}, {"strategy": "ddp"}):
            answers.append((changes, client.send("set", changes, timeout_s=60)))
        out, err = job.communicate(timeout=120)
    assert job.returncode == 0, err
    return record, answers


def _connect(port: int, job) -> ControlClient:
    deadline = time.monotonic() + 90
    while True:
        try:
            client = ControlClient("127.0.0.1", port, TOKEN)
            client.status()
            return client
        except Exception:
            if time.monotonic() > deadline or job.poll() is not None:
                raise
            time.sleep(0.2)


@pytest.fixture(scope="session")
def one_rank(tmp_path_factory):
    """The smoke sweep's last configuration (ddp, 25 MB buckets, batch 32, tiny) on 1 rank: with the smoke sweep,
    a weak-scaling pair (HPML Lab 4)."""
    return built_once(tmp_path_factory, "one-rank", _one_rank)


def _one_rank(folder):
    record = folder / "one.db"
    run = subprocess.run([sys.executable, "-m", "ddptop", "--headless", "--local", "1", "--model", "tiny", "--strategy",
                          "ddp", "--bucket-mb", "25", "--batch-size", "32", "--steps", "10", "--synthetic-size", "1280",
                          "--span-every", "2", "--record", str(record)], capture_output=True, text=True, timeout=180)
    assert run.returncode == 0, run.stderr
    return record
