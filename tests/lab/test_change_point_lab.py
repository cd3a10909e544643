"""A host that becomes slower mid-run is named (issue 45): 3 lab hosts at 0.5 core each train the tiny model; once
the headless lines say step 60, the test halves node2's CPU quota (lab/cgroups.py: cpu.max or cpu.cfs_quota_us,
written while the job runs). The front names node2's rank, once, at the step that first started after the write
(the recording's own step times against the test's wall clock: the lab's namespaces share the kernel's clock) ± 5,
on the headless lines and in the recording, and no other rank. Alone phase: a CPU quota is the fault. ~60 s."""

from __future__ import annotations

import json
import sqlite3
import time

import pytest

from ddptop.lab import cgroups
from labs import LAB_REFUSED, LabProcess, inodes, leftovers

pytestmark = pytest.mark.skipif(bool(LAB_REFUSED), reason=LAB_REFUSED or "labs work")
NODES, CPUS, SLOW = 3, 0.5, 2  # node2's quota is halved
PROFILE = """
[run]
model = "tiny"
batch_size = 16
synthetic_size = 9600
seed = 1
no_eval = true
span_every = 100
[sweep]
warmup = 1
measure = 150
configs = [{ strategy = "ddp", bucket_mb = 25 }]
"""


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("change-lab")
    (folder / "p.toml").write_text(PROFILE)
    lab = LabProcess(["--nodes", str(NODES), "--cpus-per-node", str(CPUS), "--profile", str(folder / "p.toml"),
                      "--headless", "--record", str(folder / "run.db")], folder)
    record = lab.record()
    held = inodes(record)
    controller = cgroups.find_controller()
    slowed = next(g for g in record.cgroups if g.endswith(f"-n{SLOW}"))  # node i: its namespace's name
    lab.wait_line(r"^step 60/", timeout=120)
    at = time.time()
    controller.limit(slowed, CPUS / 2)
    assert lab.wait(180) == 0, lab.output
    assert leftovers(record, held, folder) == []
    return folder / "run.db", at, lab.output


def test_the_host_whose_quota_was_halved_is_named_at_that_step_and_no_other(run):
    path, at, output = run
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    ranks = json.loads(db.execute("SELECT value FROM meta WHERE key = 'ranks'").fetchone()[0])
    (rank,) = [int(r) for r, info in ranks.items() if info["host"] == f"node{SLOW}"]
    first = db.execute("SELECT min(step) FROM steps WHERE rank = ? AND t - iter_s - aside_s >= ?", (rank, at)
                       ).fetchone()[0]
    shifts = [json.loads(d) for (d,) in db.execute("SELECT data FROM events WHERE kind = 'rank_shifted'")]
    print(f"quota halved at {at:.3f}: rank {rank}'s first step started after it: {first}; named: {shifts}")
    assert [s["rank"] for s in shifts] == [rank], shifts
    assert abs(shifts[0]["step"] - first) <= 5 and shifts[0]["after_s"] > shifts[0]["before_s"], (first, shifts)
    named = [x for x in output.splitlines() if " became " in x]
    assert len(named) == 1 and named[0].startswith(f"step {shifts[0]['step']}: rank {rank} became slower"), named
