"""ZeRO live and on the wire (issue 43): one 3-host job at 1 Gbit/s trains the wide MLP under ddp, and `ctl`
switches it to zero3, then zero1, then back to ddp, as a user would (`ddptop lab exec ddptop ctl set strategy=...`).
While it trains, this test reads every host's eth0 counters from the kernel itself (labs.NicWatch), not from ddptop:

- every switch lands on one step on every rank, and the ranks' fingerprints (of the full, gathered parameters) agree
  after each (SQL on the recording);
- each segment's bytes per step on every NIC are its formula's within 10%: ddp 2(N−1)/N·S each way; zero3 under
  gloo 4(N−1)/N·S (FSDP2: an all-gather in forward, again in backward, and the gradients' reduce-scatter, which gloo
  runs as an all-reduce: 2(N−1)/N·S; NCCL's ring would make it 3(N−1)/N·S, the issue's figure); zero1, torch's
  ZeroRedundancyOptimizer beside DDP: the all-reduce's 2(N−1)/N·S and each rank's broadcast of its updated share,
  whole parameters as torch partitions them, sent by its owner to every other rank (gloo): the rank that owns the
  6.3 MB matrix sends 2 × 6.3 MB more a step (DeepSpeed's stage 1 reduce-scatters instead: 2(N−1)/N·S);
- what ddptop records per step and rank (tx_bytes, rx_bytes) is that formula too.

Not checked here: the drop of each rank's unique memory from ddp to zero3. Read from /proc/PID/smaps_rollup by this
test, it rose by 48-67 MB instead of falling by (1 − 1/N)·(P + G + O) = 14.7 MB: FSDP2's gathered units, the
reduce-scatter's buffers and DDP's buckets freed at the switch stay in glibc's heap (its mmap threshold grows with
the sizes freed), so the process's memory shows the allocator's history, not the tensors held (issue 43's note).

The model is ddptop.examples.wide_mlp (7.4 MB of float32 parameters, little compute), so its gradients dwarf the
job's own events on the wire."""

from __future__ import annotations

import json
import math
import os
import re
import signal
import sqlite3
import subprocess
import sys

import pytest

from ddptop.lab import state
from ddptop.metrics import wire
from labs import LAB_REFUSED, REPO, LabProcess, NicWatch, inodes, leftovers

pytestmark = pytest.mark.skipif(bool(LAB_REFUSED), reason=LAB_REFUSED or "labs work")
N, BATCH = 3, 32
SHAPES = [(512, 3072), (512,), (512, 512), (512,), (10, 512), (10,)]
S = 4 * sum(math.prod(shape) for shape in SHAPES)  # float32 parameter (and gradient) bytes: 7,364,648
MODEL = REPO / "ddptop" / "examples" / "wide_mlp.py"
ORDER = ["ddp", "zero3", "zero1", "ddp"]
WARMUP, MEASURE = 3, 16
FORMULA_NAMES = ("ddp", "zero3", "zero1")  # a segment's steps: left out (a switch, the first all-gathers), then measured
OWNERS = wire.zero1_owners([math.prod(shape) for shape in SHAPES], N)  # torch's partition (tests/unit/test_zero_wire.py)
SHARES = [4 * sum(math.prod(shape) for shape, owner in zip(SHAPES, OWNERS) if owner == r) for r in range(N)]
RING = 2 * (N - 1) / N * S


def formula(strategy: str, host: int) -> tuple[float, float]:
    """(sent, received) per step by `host`'s rank, written out here from S and the shares."""
    if strategy == "ddp":
        return RING, RING
    if strategy == "zero3":  # two all-gathers of (N−1)/N·S, the reduce-scatter as an all-reduce
        return 2 * (N - 1) / N * S + RING, 2 * (N - 1) / N * S + RING
    return RING + (N - 1) * SHARES[host], RING + S - SHARES[host]  # zero1
ARGS = ["--nodes", str(N), "--link", "1gbit", "--headless", "--model", f"{MODEL}:mlp", "--batch-size", str(BATCH),
        "--synthetic-size", "2400", "--no-eval", "--seed", "3", "--strategy", "ddp", "--steps", "100000",
        "--log-every", "1"]


def last_step(lab: LabProcess) -> int:
    return max((int(m.group(1)) for line in lab.lines if (m := re.match(r"^step (\d+)/", line))), default=0)


@pytest.fixture(scope="module")
def zero_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("zero")
    db = folder / "zero.db"
    lab = LabProcess([*ARGS, "--record", str(db)], folder)
    record = lab.record()
    held = inodes(record)
    hosts = sorted((n for n in record.namespaces if n[-3:-1] == "-n"), key=lambda n: int(n[-1]))
    nics = NicWatch(hosts)
    nics.start()
    env = {**os.environ, "PYTHONPATH": str(REPO), state.STATE_ENV: str(folder)}
    answers = []
    try:
        lab.wait_line(rf"^step {WARMUP + MEASURE}/", timeout=300)
        for strategy in ORDER[1:]:
            done = subprocess.run([sys.executable, "-m", "ddptop", "lab", "exec", "ddptop", "ctl", "set",
                                   f"strategy={strategy}"], capture_output=True, text=True, timeout=120, env=env)
            answers.append((strategy, done.returncode, done.stdout + done.stderr))
            assert done.returncode == 0, answers
            lab.wait_line(rf"^step {last_step(lab) + WARMUP + MEASURE + 1}/", timeout=300)
    finally:
        lab.proc.send_signal(signal.SIGINT)
        code = lab.wait(120)
        nics.done.set()
    print(lab.output[-3000:], answers)
    assert code == 0, lab.output[-3000:]
    yield sqlite3.connect(f"file:{db}?mode=ro", uri=True), nics
    assert leftovers(record, held, lab.lab_dir) == []


def segments(db: sqlite3.Connection) -> list[tuple[int, int, str]]:
    """(segment, its first step, its strategy), in order."""
    return [(seg, step, json.loads(config)["strategy"])
            for seg, step, config in db.execute("SELECT segment, step, config FROM segments ORDER BY segment")]


def measured(db: sqlite3.Connection, segment: int, host: int) -> list[tuple[float, float]]:
    """(end time, step time) of a segment's measured steps on `host`'s rank (warm-up left out)."""
    rows = db.execute("SELECT t, iter_s FROM steps WHERE segment = ? AND rank = ? ORDER BY step",
                      (segment, host)).fetchall()
    return rows[WARMUP:]


def test_every_switch_lands_on_one_step_with_one_model(zero_run):
    db, _ = zero_run
    assert [s for _, _, s in segments(db)] == ORDER
    applied = db.execute("SELECT rank, step, json_extract(data, '$.segment'), json_extract(data, '$.fingerprint') "
                         "FROM events WHERE kind = 'config_applied'").fetchall()
    for segment, first, _ in segments(db):
        mine = [(rank, step, fp) for rank, step, seg, fp in applied if seg == segment]
        assert sorted(r for r, _, _ in mine) == list(range(N)), mine
        assert {step for _, step, _ in mine} == {first}, mine  # the same step on every rank
        assert len({fp for _, _, fp in mine}) == 1, mine  # one model on every rank after the switch


def test_each_segments_nic_bytes_per_step_are_its_formulas(zero_run):
    db, nics = zero_run
    found = {}
    for segment, _, strategy in segments(db):
        for host in range(N):
            rows = measured(db, segment, host)
            assert len(rows) >= MEASURE, (segment, host, len(rows))
            (rx0, tx0), (rx1, tx1) = nics.after(host, rows[0][0]), nics.after(host, rows[-1][0])
            steps = len(rows) - 1
            found[(segment, strategy, host)] = ((tx1 - tx0) / steps, (rx1 - rx0) / steps)
    print({k: (round(a / 1e6, 3), round(b / 1e6, 3)) for k, (a, b) in found.items()}, "MB per step, sent/received",
          {(s, h): tuple(round(x / 1e6, 3) for x in formula(s, h)) for s in FORMULA_NAMES for h in range(N)})
    for (segment, strategy, host), (sent, received) in found.items():
        want = formula(strategy, host)
        assert sent == pytest.approx(want[0], rel=0.10), (segment, strategy, host, sent, want)
        assert received == pytest.approx(want[1], rel=0.10), (segment, strategy, host, received, want)


def test_ddptops_own_bytes_per_step_are_what_the_nics_counted(zero_run):
    """What ddptop records per step and rank (its comm accounting: tx_bytes, rx_bytes) is the same formula: the
    screen's and the report's MB/step can be trusted for the zero strategies too."""
    db, _ = zero_run
    for segment, _, strategy in segments(db):
        for host in range(N):
            rows = db.execute("SELECT tx_bytes, rx_bytes FROM steps WHERE segment = ? AND rank = ? AND step > ?",
                              (segment, host, WARMUP)).fetchall()
            want = formula(strategy, host)
            assert {r[0] for r in rows[WARMUP:]} and all(
                r[0] == pytest.approx(want[0], rel=0.01) and r[1] == pytest.approx(want[1], rel=0.01)
                for r in rows[WARMUP:]), (segment, strategy, host, set(rows[WARMUP:]), want)
