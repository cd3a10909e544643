"""Ctrl-C in a lab while its job starts (issue 26): the hosts the stop reaches are no crash. Before, a Ctrl-C
before node 0's front started its rank printed `node 1 exited with signal 15; its last lines:` and nothing (our
own SIGTERM, an empty log), and one while the ranks started printed node 1's failed handshake and exited 4."""

from __future__ import annotations

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
