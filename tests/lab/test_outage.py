"""A lab host's network going away, as a pulled cable: its port on the switch goes down. Silent past --lost-after,
the rank is lost (RankLost); back up, it is back (RankBack), and training goes on; down for longer than
--collective-timeout, the collectives give up and the job ends with one line and exit 5. Each event is checked in
the recording against the test's own clock, and the lab leaves nothing."""

from __future__ import annotations

import json
import re
import sqlite3
import subprocess
import time

import pytest

from labs import LAB_REFUSED, LabProcess, inodes, leftovers

pytestmark = pytest.mark.skipif(bool(LAB_REFUSED), reason=LAB_REFUSED or "labs work")
# a heartbeat every second, read once a second: lost 2-4 s after the cable goes; back up then, TCP's backed-off
# retransmission resumes the waiting collective by ~6.2 s after the cut, well inside 10 s
LOST_AFTER_S, COLLECTIVE_S = 2, 10
HEARTBEAT_EVERY_S = 1.0  # ddptop.control.agent's: a rank's silence starts up to this long before the cut
# `single`: the only collective of a step is the step-boundary exchange on ddptop's control group, the one whose
# timeout was torch's 30 min (new_group's default) whatever the job's; the gradient collectives always had it
ARGS = ["--nodes", "2", "--link", "100mbit", "--headless", "--model", "tiny", "--strategy", "single",
        "--batch-size", "16", "--synthetic-size", "1280", "--no-eval", "--log-every", "1", "--steps", "100000",
        "--lost-after", str(LOST_AFTER_S), "--collective-timeout", str(COLLECTIVE_S)]


def cable(switch: str, port: str, state: str) -> float:
    subprocess.run(["ip", "-n", switch, "link", "set", port, state], check=True)
    return time.time()


def finish(lab: LabProcess, timeout: float) -> int:
    """The lab's exit code; past `timeout` a SIGTERM first (the lab removes itself on it), SIGKILL only 30 s later
    (a killed lab leaves its namespaces until the next `ddptop lab` with the same state folder)."""
    try:
        code = lab.proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        lab.proc.terminate()
        lab.wait(30)
        raise AssertionError(f"the job did not end within {timeout} s of the cut:\n{lab.output}") from None
    return lab.wait(30)


def steps_after(lab: LabProcess, seen: int) -> int:
    return sum(1 for line in lab.lines[seen:] if re.match(r"^step \d+/100000", line))


def test_a_host_whose_cable_is_pulled_is_lost_then_back_and_past_the_timeout_the_job_ends_with_exit_5(tmp_path):
    db = tmp_path / "outage.db"
    lab = LabProcess([*ARGS, "--record", str(db)], tmp_path)
    record = lab.record()
    held = inodes(record)
    switch = next(n for n in record.namespaces if n.endswith("-sw"))
    port = f"p{record.tag}n1"  # node 1's port on the bridge (ddptop.lab.cluster.Lab.port)
    lab.wait_line(r"^step \d+/100000", timeout=120)
    try:
        down = cable(switch, port, "down")
        lab.wait_line(r"^rank 1 lost after step \d+: no heartbeat", timeout=15)
        up = cable(switch, port, "up")
        lab.wait_line(r"^rank 1 is back at step", timeout=20)
        seen = len(lab.lines)
        deadline = time.monotonic() + 20
        while steps_after(lab, seen) < 2 and time.monotonic() < deadline:  # training goes on
            time.sleep(0.2)
        assert steps_after(lab, seen) >= 2, lab.output
        cut = cable(switch, port, "down")  # for good: the collectives wait, then give up
        code = finish(lab, COLLECTIVE_S + 60)
        ended = time.time()
    finally:
        if lab.proc.poll() is None:
            lab.proc.terminate()
            lab.wait(30)
    assert code == 5, lab.output
    assert "Traceback" not in lab.output
    # node 0's rank says it in one line; node 1's is the last of its log that the lab shows
    timed_out = [line.strip() for line in lab.lines if "a collective waited longer than 10 s" in line]
    assert len(timed_out) == 2 and all(line.startswith("ddptop") for line in timed_out), lab.output
    assert lab.lines[-1].startswith("ddptop lab ") and lab.lines[-1].endswith(": removed")
    assert COLLECTIVE_S <= ended - cut < COLLECTIVE_S + 45, ended - cut
    assert leftovers(record, held, tmp_path) == []
    rows = sqlite3.connect(f"file:{db}?mode=ro", uri=True).execute(
        "SELECT kind, rank, t, data FROM events WHERE kind IN ('rank_lost', 'rank_back') ORDER BY seq").fetchall()
    lost = [(t, json.loads(data)) for kind, rank, t, data in rows if kind == "rank_lost" and rank == 1 and t > down]
    back = [(t, json.loads(data)) for kind, rank, t, data in rows if kind == "rank_back" and rank == 1 and t > down]
    # silent past --lost-after, then lost: the silence began with the last heartbeat, up to 1 s before the cut
    assert lost and down + LOST_AFTER_S - HEARTBEAT_EVERY_S <= lost[0][0] < up, (down, up, rows)
    assert "no heartbeat" in lost[0][1]["reason"]
    assert back and up <= back[0][0] < cut and back[0][1]["silent_s"] >= LOST_AFTER_S, (up, rows)
