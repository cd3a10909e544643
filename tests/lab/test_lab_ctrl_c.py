"""Ctrl-C in a lab while its job starts (issue 26): the hosts the stop reaches are no crash. Before, a Ctrl-C
before node 0's front started its rank printed `node 1 exited with signal 15; its last lines:` and nothing (our
own SIGTERM, an empty log), and one while the ranks started printed node 1's failed handshake and exited 4."""

from __future__ import annotations

import os
import signal
import time

import pytest

from ddptop.lab import netns
from labs import LAB_REFUSED, LabProcess, inodes, leftovers

pytestmark = pytest.mark.skipif(bool(LAB_REFUSED), reason=LAB_REFUSED or "labs work")
TINY = ["--nodes", "2", "--headless", "--model", "tiny", "--batch-size", "16", "--synthetic-size", "1280",
        "--no-eval", "--steps", "5000", "--no-record"]


@pytest.mark.parametrize("when, code", [(None, 130),  # node 1's process runs, the front still imports torch
                                        (r"^ddptop: 2 ranks, master", 0)],  # the front runs, its rank 0 starts
                         ids=["front-starting", "ranks-starting"])
def test_a_ctrl_c_while_the_job_starts_reads_as_a_stop_not_a_crash(tmp_path, when, code):
    lab = LabProcess(TINY, tmp_path)
    record = lab.record()
    held = inodes(record)
    if when is None:
        node1 = next(ns for ns in record.namespaces if ns.endswith("-n1"))
        deadline = time.monotonic() + 30
        while not netns.namespace_pids(node1) and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(0.1)  # the lab marks the job running just after it starts the last host
    else:
        lab.wait_line(when)
    lab.proc.send_signal(signal.SIGINT)  # what Ctrl-C does when the lab's terminal is not handed to node 0
    assert lab.wait(60) == code, lab.output
    assert "exited with" not in lab.output and "its last lines" not in lab.output, lab.output
    assert f"ddptop lab {record.tag}: removed" in lab.output
    assert leftovers(record, held, tmp_path) == []


TWO_RUNS = """[lab]
nodes = 2
link = "1gbit"
runs = [{ name = "first", nodes = 2 }, { name = "second", nodes = 2 }]

[run]
model = "tiny"
batch_size = 16
synthetic_size = 1280
no_eval = true
steps = 5000
"""


def _front_group(record) -> int:
    """Node 0's front: the process group leader among node 0's ddptop processes (the terminal's foreground group)."""
    node0 = next(ns for ns in record.namespaces if ns.endswith("-n0"))
    for pid in netns.namespace_pids(node0):
        try:
            if os.getpgid(pid) == pid and b"ddptop" in open(f"/proc/{pid}/cmdline", "rb").read():
                return pid
        except OSError:
            continue
    raise AssertionError(f"no front process in {node0}")


@pytest.mark.parametrize("to", ["lab", "terminal"])
def test_a_stop_in_a_profiles_first_run_starts_no_other_run_and_writes_no_partial_report(tmp_path, to):
    """Before, a Ctrl-C stopped only the run going on and the profile's next run started: `_supervise` took the
    signal and the terminal's Ctrl-C (sent to the front's group alone) never reached the lab process at all."""
    profile = tmp_path / "two-runs.toml"
    profile.write_text(TWO_RUNS)
    lab = LabProcess(["--profile", str(profile), "--headless", "--record-dir", str(tmp_path / "runs")], tmp_path)
    record = lab.record()
    held = inodes(record)
    lab.wait_line(r"^ddptop lab: run first")
    lab.wait_line(r"^step \d+")
    if to == "lab":
        lab.proc.send_signal(signal.SIGINT)  # the lab's terminal not handed to node 0 (no tty)
    else:
        os.killpg(_front_group(record), signal.SIGINT)  # Ctrl-C on the terminal the lab handed to node 0's front
    assert lab.wait(90) == 0, lab.output
    assert "ddptop lab: run second" not in lab.output, lab.output
    assert "not started: run second" in lab.output and "stopped, so no report" in lab.output, lab.output
    assert not (tmp_path / "runs" / "report").exists()
    assert f"ddptop lab {record.tag}: removed" in lab.output
    assert leftovers(record, held, tmp_path) == []
