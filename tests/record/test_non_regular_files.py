"""A FIFO, a directory, a device or a socket given as a recording is refused in one line (exit 6), never read.

Each command runs as a real process under a timeout: before the fix `info` and `report` on a FIFO blocked in
open() forever, waiting for a writer (and /dev/zero would be read without end).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest


def commands(path: str, tmp_path) -> list[list[str]]:
    return [["info", path], ["report", path, "-o", str(tmp_path / "report")],
            ["export", path, "--csv", str(tmp_path / "csv")], ["replay", path, "--headless", "--instant"]]


@pytest.fixture(params=["fifo", "directory", "dev-zero", "socket"])
def odd_file(request, tmp_path):
    kind = request.param
    if kind == "fifo":
        path = tmp_path / "run.db"
        os.mkfifo(path)
        yield str(path), "a named pipe (FIFO)"
    elif kind == "directory":
        (tmp_path / "run.db").mkdir()
        yield str(tmp_path / "run.db"), "a directory"
    elif kind == "dev-zero":
        yield "/dev/zero", "a character device"
    else:
        path = str(tmp_path / "run.db")
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind(path)
        server.listen(1)
        try:
            yield path, "a socket"
        finally:
            server.close()


def test_every_command_refuses_a_file_that_is_not_a_regular_one(odd_file, tmp_path):
    path, words = odd_file
    # every command on the FIFO (the one that hung); `info` (the check they all share) on the rest
    for argv in commands(path, tmp_path)[:None if words.endswith("(FIFO)") else 1]:
        try:
            run = subprocess.run([sys.executable, "-m", "ddptop", *argv], capture_output=True, text=True, timeout=20)
        except subprocess.TimeoutExpired:
            pytest.fail(f"ddptop {argv[0]} on {words} hung (no answer in 20 s)")
        assert run.returncode == 6, (argv, run.stderr)
        assert run.stderr.strip() == f"ddptop: {path} is {words}, not a recording", (argv, run.stderr)
        assert "Traceback" not in run.stdout + run.stderr
