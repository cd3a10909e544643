"""Every live setting through `ddptop ctl` (the command, as a user types it) on a real headless 2-rank job, each
checked in the recording with SQL: the config in force per segment on every rank, the switch at the step ctl named
on every rank, the models' fingerprints equal across ranks, the buckets and collectives each step really ran."""

from __future__ import annotations

import json
import os
import re
import sqlite3
import subprocess
import time
from pathlib import Path

import pytest

from ddptop.control.client import ControlClient
from ddptop.errors import DdptopError

from jobs import killed_if_left
from test_run_cli import DDPTOP, TINY

# each change, and what the segment it starts must run (start: ddp, 25 MB buckets, batch 16, lr 0.1)
CHANGES = [
    (["bucket_mb=0.02"], {"strategy": "ddp", "bucket_mb": 0.02, "async_op": False, "batch_size": 16, "lr": 0.1}),
    (["strategy=allreduce", "async_op=true"], {"strategy": "allreduce", "async_op": True}),
    (["async_op=false"], {"async_op": False}),
    (["batch_size=8", "scale_lr=true"], {"batch_size": 8, "lr": 0.05}),  # linear scaling: half the batch, half lr
    (["lr=0.02"], {"lr": 0.02}),
    (["strategy=gather-scatter"], {"strategy": "gather-scatter"}),
    (["strategy=single"], {"strategy": "single"}),
    (["strategy=ddp"], {"strategy": "ddp"}),  # bucket_mb 0.02 was remembered for the next switch to DDP
    # issue 25: K micro-steps per optimizer step and gradients on the wire in 2 bytes, then PowerSGD (rank 2)
    (["accum=3", "compress=fp16"], {"accum": 3, "compress": "fp16"}),
    (["strategy=allreduce", "compress=bf16", "accum=2"], {"strategy": "allreduce", "compress": "bf16", "accum": 2}),
    (["strategy=ddp", "compress=powersgd:2"], {"strategy": "ddp", "compress": "powersgd:2"}),
]
# set while the allreduce segment runs: meaningless there, each refused with one line and exit 2
REFUSED = [(["compress=powersgd"], "applies only to ddp"), (["strategy=single", "compress=fp16"], "means nothing"),
           (["accum=0"], "accum must be"), (["compress=zip"], "unknown compression")]
POWERSGD_STEPS = 14  # past its 10 warm-up steps of plain all-reduce (ddp.POWERSGD_START_STEP)
PAUSE_S = 1.5


def ctl(*args: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(DDPTOP + ["ctl", *args], capture_output=True, text=True, timeout=60, env=env)


def job_step(env: dict) -> tuple[int, bool]:
    """The job's step and whether it is paused, as `ctl status --json` says."""
    status = json.loads(ctl("status", "--json", env=env).stdout)
    return status["step"], status["paused"]


def wait_until(env: dict, done, what: str, timeout_s: float = 60) -> tuple[int, bool]:
    """Polls the status `ctl status` reads, in this process (a `ctl` process every 0.2 s was most of this file's
    CPU); the changes themselves and the paused check go through the command."""
    deadline = time.monotonic() + timeout_s
    client = None
    while time.monotonic() < deadline:
        try:
            if client is None:
                job = next(j for f in Path(env["DDPTOP_STATE_DIR"]).glob("*.json")
                           if "token" in (j := json.loads(f.read_text())))  # the job's file, not an ended one's
                client = ControlClient(job["master"], job["port"], job["token"])
            status = client.status()
            now = status["step"], status["paused"]
            if done(*now):
                return now
        except (StopIteration, OSError, ValueError, KeyError, DdptopError, RuntimeError):  # not answering yet: the
            client = None  # ranks are still importing torch
        time.sleep(0.2)
    raise AssertionError(f"the job never {what}")


@pytest.fixture(scope="module")
def driven(tmp_path_factory):
    """The job, every change made with `ddptop ctl set` and a pause with `ctl pause`/`resume`, then `ctl stop`."""
    tmp = tmp_path_factory.mktemp("settings")
    env = {**os.environ, "DDPTOP_STATE_DIR": str(tmp / "jobs")}
    record = tmp / "run.db"
    job = subprocess.Popen(DDPTOP + ["--local", "2", "--steps", "100000", "--strategy", "ddp", "--log-every", "1000",
                                     "--span-every", "1", "--record", str(record), *TINY],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    applied, paused = [], {}
    with killed_if_left(job):
        wait_until(env, lambda step, held: step >= 2, "trained")
        for args, changes in CHANGES:
            result = ctl("set", *args, env=env)
            assert result.returncode == 0, result.stderr
            said = re.fullmatch(r"applied at step (\d+) \(segment (\d+)\) on every rank\n", result.stdout)
            assert said, result.stdout
            applied.append((int(said.group(1)), int(said.group(2))))
            if changes.get("compress") == "bf16":
                paused["refused"] = [ctl("set", *args, env=env) for args, _ in REFUSED]
            more = POWERSGD_STEPS if changes.get("compress", "").startswith("powersgd") else 3
            wait_until(env, lambda step, held: step >= applied[-1][0] + more, "trained on")  # a few steps of each
        assert ctl("pause", env=env).returncode == 0
        paused["step"], _ = wait_until(env, lambda step, held: held, "paused")
        paused["from"] = time.time()  # nothing may train between here and the resume, on any rank
        time.sleep(PAUSE_S)
        assert job_step(env) == (paused["step"], True)
        paused["to"] = time.time()
        assert ctl("resume", env=env).returncode == 0
        wait_until(env, lambda step, held: step >= paused["step"] + 3, "resumed")
        assert ctl("stop", env=env).returncode == 0
        out, err = job.communicate(timeout=60)
    assert job.returncode == 0, err
    db = sqlite3.connect(f"file:{record}?mode=ro", uri=True)
    yield db, applied, paused
    db.close()


def events(db: sqlite3.Connection, kind: str) -> list[dict]:
    return [json.loads(data) for (data,) in db.execute("SELECT data FROM events WHERE kind = ? ORDER BY seq", (kind,))]


def expected_configs() -> list[dict]:
    configs, config = [], {"strategy": "ddp", "bucket_mb": 25.0, "async_op": False, "batch_size": 16, "lr": 0.1,
                           "accum": 1, "compress": "none", "lr_warmup_steps": 0, "shard_unit": ""}
    for _, changes in CHANGES:
        config = {**config, **changes}
        configs.append(config)
    return configs


def test_each_setting_is_the_config_of_its_segment_from_the_step_ctl_named_on_every_rank(driven):
    db, applied, _ = driven
    segments = {seg: (step, json.loads(config)) for seg, step, config in db.execute("SELECT segment, step, config "
                                                                                  "FROM segments")}
    assert [seg for _, seg in applied] == list(range(1, len(CHANGES) + 1))
    for (step, seg), config in zip(applied, expected_configs()):
        assert segments[seg] == (step, config), seg
        switched = [e for e in events(db, "config_applied") if e["segment"] == seg]
        assert sorted(e["rank"] for e in switched) == [0, 1]
        assert {e["step"] for e in switched} == {step} and all(e["config"] == config for e in switched)
    # every step of every rank ran under the segment in force at that step, with that segment's batch
    starts = sorted((step, seg) for seg, (step, _) in segments.items())
    for rank in (0, 1):
        rows = db.execute("SELECT step, segment, batch_size FROM steps WHERE rank = ? ORDER BY step",
                          (rank,)).fetchall()
        assert [r[0] for r in rows] == list(range(len(rows)))  # each step once
        for step, seg, batch in rows:  # a step trains accum micro-batches: accum × batch_size samples per rank
            in_force = max(s for start, s in starts if start <= step)
            config = segments[in_force][1]
            assert (seg, batch) == (in_force, config["batch_size"] * config["accum"]), (rank, step)


def test_every_rank_holds_the_same_model_at_every_switch_and_at_the_end(driven):
    db, _, _ = driven
    prints: dict[int, dict[int, str]] = {}
    for e in events(db, "config_applied"):
        prints.setdefault(e["segment"], {})[e["rank"]] = e["fingerprint"]
    assert len(prints) == len(CHANGES) + 1
    for seg, by_rank in prints.items():
        assert len(by_rank) == 2 and len(set(by_rank.values())) == 1 and len(by_rank[0]) == 64, seg
    ends = {e["rank"]: (e["fingerprint"], e["reason"]) for e in events(db, "run_finished")}
    assert ends[0] == ends[1] and ends[0][1] == "stopped"  # the last segment is DDP: one model
    assert events(db, "models_diverged") == []


def collectives(db: sqlite3.Connection, segment: int) -> set[tuple]:
    """What each rank ran in a segment's sampled steps: comm and wait spans as (rank, kind, name)."""
    found = set()
    for rank, spans in db.execute("SELECT rank, spans FROM spans WHERE segment = ? AND step > "
                                  "(SELECT step FROM segments WHERE segment = ?)", (segment, segment)):
        found |= {(rank, kind, name) for kind, name, *_ in json.loads(spans) if kind in ("comm", "wait")}
    return found


def test_each_segment_ran_the_collectives_its_setting_means(driven):
    """Ground truth from the spans each rank timed around its own collectives: DDP at 0.02 MB fills two buckets
    of the tiny model's 83.9 KB (at 25 MB, one), async all_reduce waits on its handles, gather-scatter gathers."""
    db, _, _ = driven
    both = {0, 1}
    names = {seg: {name for _, _, name in collectives(db, seg)} for seg in range(len(CHANGES) + 1)}
    for seg in (0,):
        assert names[seg] == {"bucket 0"}
    for seg in (1, 8):
        assert names[seg] == {"bucket 0", "bucket 1"}
        assert {rank for rank, _, _ in collectives(db, seg)} == both
    assert "wait async handles" in names[2] and "allreduce classifier.weight" in names[2]
    for seg in (3, 4, 5):
        assert "wait async handles" not in names[seg] and "allreduce classifier.weight" in names[seg]
    assert {"gather classifier.weight", "scatter classifier.weight"} <= names[6]
    assert names[7] == set()  # single: every rank alone


def test_pause_holds_every_rank_at_one_step_until_resume(driven):
    db, _, paused = driven
    states = events(db, "run_state")
    assert sorted((e["rank"], e["paused"]) for e in states) == [(0, False), (0, True), (1, False), (1, True)]
    assert {e["step"] for e in states} == {paused["step"]}
    for rank in (0, 1):  # the test's own clock: no rank finished a step while it held the job paused
        during = db.execute("SELECT count(*) FROM steps WHERE rank = ? AND t BETWEEN ? AND ?",
                            (rank, paused["from"], paused["to"])).fetchone()[0]
        assert during == 0, rank
        after = db.execute("SELECT count(*) FROM steps WHERE rank = ? AND step > ?", (rank, paused["step"])).fetchone()
        assert after[0] >= 3


def test_accum_and_compression_move_what_they_mean_and_meaningless_ones_are_refused(driven):
    """From each rank's own spans and steps: fp16/bf16 hand half of float32's bytes per optimizer step to the
    collectives whatever accum is (one sync per step), and DDP syncs once per step under accum 3 (its buckets,
    once); PowerSGD's steps after its warm-up move far less. Each meaningless `set` was one line, exit 2."""
    db, _, paused = driven
    for result, (_, words) in zip(paused["refused"], REFUSED):
        assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
        assert len(result.stderr.strip().splitlines()) == 1 and words in result.stderr, result.stderr

    def per_step(segment: int, skip: int = 1) -> set[int]:
        return {b for (b,) in db.execute("SELECT comm_bytes FROM steps WHERE segment = ? AND rank = 0 AND step > "
                                         "(SELECT step FROM segments WHERE segment = ?) + ?", (segment, segment, skip))}

    full = 83_944  # the tiny model's float32 gradients (README: "tiny: 83.9 KB")
    assert per_step(8) == {full} and per_step(9) == {full // 2} and per_step(10) == {full // 2}
    assert {name for _, _, name in collectives(db, 9)} == {"bucket 0", "bucket 1"}  # once per step, not 3 times
    powersgd = per_step(11, POWERSGD_STEPS - 3)  # its steps from the 11th on: the rank-2 factors and the vectors
    assert powersgd and max(powersgd) < full // 5, powersgd


def test_steps_have_micro_steps_exactly_where_their_segment_accumulates(driven):
    """micro_s (the K−1 unsynchronized micro-steps) on every step of the accum 2 and 3 segments set live, on none of
    the accum 1 ones; the segment's accum read from the recording's own segments table."""
    db, _, _ = driven
    rows = db.execute("SELECT DISTINCT json_extract(g.config, '$.accum') > 1, s.micro_s > 0 FROM steps s "
                      "JOIN segments g ON g.segment = s.segment").fetchall()
    assert sorted(rows) == [(0, 0), (1, 1)], rows
