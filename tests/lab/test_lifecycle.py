"""`ddptop lab` leaves nothing behind: after a normal end, a Ctrl-C, and a SIGKILL of its own process (the next
start removes what the killed one left), and it never touches a lab or namespace that is not its own."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from ddptop.lab import cgroups, netns, state
from labs import LAB_REFUSED, REPO, LabProcess, inodes, leftovers

pytestmark = pytest.mark.skipif(bool(LAB_REFUSED), reason=LAB_REFUSED or "labs work")
TINY = ["--headless", "--model", "tiny", "--batch-size", "16", "--synthetic-size", "1280", "--no-eval",
        "--log-every", "1", "--link", "100mbit"]


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_ctrl_c_or_sigterm_stop_the_job_at_a_step_and_remove_the_lab(signum, tmp_path, monkeypatch):
    if signum == signal.SIGINT:  # steps of 2 s (an injected sleep), as a lab's VGG-11 takes: issue 26's `ctl status`
        # read 0.75 s of telemetry back, found no step there and showed stepping ranks "(no recent step in the store)"
        monkeypatch.setenv("DDPTOP_TEST_MODEL", "sleep-ms=2000")
    lab = LabProcess(["--nodes", "2", *TINY, "--steps", "5000"], tmp_path)
    record = lab.record()
    held = inodes(record)
    lab.wait_line(r"^step \d+/5000")
    if signum == signal.SIGINT:  # meanwhile, from "another terminal": ctl reaches the job through node 0
        ctl = subprocess.run([sys.executable, "-m", "ddptop", "lab", "exec", "ddptop", "ctl", "status"],
                             capture_output=True, text=True, timeout=60,
                             env={**os.environ, "PYTHONPATH": str(REPO), state.STATE_ENV: str(tmp_path)})
        rows = {line.split()[0]: line.split()[1] for line in ctl.stdout.splitlines()[1:]
                if line.split() and line.split()[0].isdigit()}
        assert ctl.returncode == 0 and "running" in ctl.stdout and sorted(rows) == ["0", "1"], (ctl.stdout, ctl.stderr)
        assert all(s[0].isdigit() and float(s) >= 2.0 for s in rows.values()), ctl.stdout  # recent s/step: the sleep
    lab.proc.send_signal(signum)  # SIGINT: what Ctrl-C does when the lab's terminal is not handed to node 0
    assert lab.wait(120) == 0, lab.output
    assert "(stopped)" in lab.output and f"ddptop lab {record.tag}: removed" in lab.output
    assert leftovers(record, held, tmp_path) == []


def test_a_crashed_host_fails_the_job_with_one_line_and_the_lab_is_removed(tmp_path):
    lab = LabProcess(["--nodes", "3", *TINY, "--steps", "5000"], tmp_path)
    record = lab.record()
    held = inodes(record)
    lab.wait_line(r"^step \d+/5000")
    for pid in netns.namespace_pids(record.namespaces[-1]):  # every process on the last host: its rank dies
        os.kill(pid, signal.SIGKILL)
    assert lab.wait(120) == 5, lab.output  # PeerLost, as on a cluster whose node died
    assert "ddptop lab: node 2 exited with signal 9" in lab.output
    assert leftovers(record, held, tmp_path) == []


def test_a_killed_lab_is_removed_by_the_next_start_which_removes_itself_too(tmp_path):
    killed = LabProcess(["--nodes", "3", *TINY, "--steps", "5000"], tmp_path)
    old = killed.record()
    old_held = inodes(old)
    killed.wait_line(r"^step \d+/5000")
    killed.proc.kill()
    killed.wait(30)
    assert all(netns.namespace_exists(n) for n in old.namespaces), "nothing was left to remove"
    assert all(os.path.isdir(g) for g in old.cgroups)

    fresh = LabProcess(["--nodes", "2", *TINY, "--steps", "20"], tmp_path)
    new = fresh.record()
    new_held = inodes(new)
    # gone before the new lab was built; the kernel may give a freed namespace's inode to one of the new lab's
    # namespaces, whose processes are then the new lab's, not leftovers
    assert leftovers(old, old_held - new_held, tmp_path) == []
    assert fresh.wait(120) == 0, fresh.output
    assert "finished: 20 steps on 2 ranks (done)" in fresh.output
    assert leftovers(new, new_held, tmp_path) == []


def test_a_running_lab_and_foreign_names_are_never_removed(tmp_path):
    """Dead owners' records are removed only as far as their names are a lab's; a live owner's lab stays."""
    foreign = f"ddpt-foreign-{os.getpid()}"  # a namespace and a cgroup no lab made, listed by a forged state file
    controller = cgroups.find_controller()
    netns.add_namespace(foreign)
    group = controller.create(foreign, 0.5)
    try:
        tag = "abcdef"  # its owner: a pid above the kernel's pid_max, so never alive
        forged = state.LabRecord(tag, 1 << 22, "0", time.time(), namespaces=[foreign, "lo"],
                                 cgroups=[group, os.path.dirname(group), "/"])
        (tmp_path / f"{tag}.json").write_text(json.dumps(forged.__dict__))
        live = state.LabRecord("123456", os.getpid(), state.process_start(os.getpid()), time.time())
        (tmp_path / "123456.json").write_text(json.dumps(live.__dict__))
        os.environ[state.STATE_ENV] = str(tmp_path)
        try:
            assert state.remove_dead_labs() == [tag]
        finally:
            del os.environ[state.STATE_ENV]
        assert netns.namespace_exists(foreign) and os.path.isdir(group)
        assert (tmp_path / "123456.json").exists() and not (tmp_path / f"{tag}.json").exists()
    finally:
        netns.delete_namespace(foreign)
        os.rmdir(group)
