"""The user's own training loop through ddptop.api under torchrun: switched live by `ctl`, recorded in full.

Ground truth comes from the user's script itself: the losses it computed and the steps it ran (a JSON file per
rank), its final parameters (torch.save, hashed here), and ranks seeded apart (so equal fingerprints at segment 0
mean rank 0's model really reached rank 1)."""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import subprocess
import sys

import dataclasses

import torch
from torch import nn

from ddptop.api import OWN_SETTINGS, OWNED_BY_LOOP
from ddptop.config import SyncConfig
from jobs import torchrun
from test_ctl_cli import ctl, wait_for_status
from test_run_cli import assert_one_line_error

SCRIPT = '''
import json, sys, time
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler
from ddptop.api import join

out, record = sys.argv[1], sys.argv[2]
job = join(strategy="allreduce", record=record, log_every=1000, span_every=2)
torch.manual_seed(job.rank)  # each rank builds other weights: prepare makes them rank 0's
model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
model, optimizer = job.prepare(model, optimizer)
x = torch.randn(512, 8, generator=torch.Generator().manual_seed(0))
data = TensorDataset(x, x.sum(1, keepdim=True))
sampler = DistributedSampler(data, job.world_size, job.rank)
loader = DataLoader(data, batch_size=16, sampler=sampler)
losses, epoch = [], 0


def save():
    try:
        job.prepare(model, optimizer)
    except Exception as exc:
        twice = f"{type(exc).__name__}: {exc}"
    torch.save(model.state_dict(), f"{out}/rank{job.rank}.pt")
    json.dump({"losses": losses, "twice": twice}, open(f"{out}/rank{job.rank}.json", "w"))


while True:
    sampler.set_epoch(epoch)
    for inputs, targets in loader:
        if job.stopped:
            save()
            if job.rank == 1:
                sys.exit(0)  # the job ends at exit
        with job.step(batch_size=len(inputs), epoch=epoch):  # rank 0 goes on as if it never looked: one line
            loss = nn.functional.mse_loss(model(inputs), targets)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            job.log(loss=loss)
        losses.append(loss.item())
        # paced (a loop waiting on its data, say): unpaced, this model's ~10 ms steps kept both cores busy the
        # whole time ctl drives the job (~1300 steps recorded where ~200 show the same)
        time.sleep(0.05)
    epoch += 1
'''
SWITCHES = ["single", "gather-scatter", "ddp"]
OWN_TAKES = "an own loop takes strategy, bucket_mb, async_op and compress"


def test_every_setting_is_either_an_own_loops_or_refused():
    """A setting added to SyncConfig (what `ctl set` changes) is either applied by the strategy an own loop runs
    or refused by its rank 0: never accepted and recorded without anything applying it."""
    fields = {f.name for f in dataclasses.fields(SyncConfig)}
    assert set(OWN_SETTINGS) | set(OWNED_BY_LOOP) == fields and not set(OWN_SETTINGS) & set(OWNED_BY_LOOP)


def test_a_users_own_loop_under_torchrun_is_switched_by_ctl_and_recorded_step_by_step(tmp_path):
    env = {**os.environ, "DDPTOP_STATE_DIR": str(tmp_path / "jobs")}
    (tmp_path / "train.py").write_text(SCRIPT)
    record = tmp_path / "own.db"
    applied = []
    with torchrun([str(tmp_path / "train.py"), str(tmp_path), str(record)], env, cwd=tmp_path) as job:
        assert "allreduce batch=16" in wait_for_status(env, deadline_s=90)
        for strategy in SWITCHES:
            result = ctl("set", f"strategy={strategy}", env=env)
            assert result.returncode == 0 and result.stdout.startswith("applied at step "), result.stderr
            applied.append(int(result.stdout.split()[3].rstrip(",:")))
        # the loader and the optimizer are the script's: rank 0 refuses to change them, in one line (exit 1)
        assert_one_line_error(ctl("set", "batch_size=8", env=env), 1, "batch_size belongs to this loop's own")
        assert_one_line_error(ctl("set", "lr=0.5", env=env), 1, "lr belongs to this loop's own")
        # the steps and the scheduler are the script's too: accumulation and warm-up would be recorded, never run
        for change in ("accum=4", "lr_warmup_steps=50", "accum=2 compress=fp16"):
            assert_one_line_error(ctl("set", *change.split(), env=env), 1,
                                  f"{change.split('=')[0]} belongs to this loop's own", OWN_TAKES)
        assert ctl("stop", env=env).returncode == 0
        out, err = job.communicate(timeout=90)
    assert job.returncode == 0 and "Traceback" not in err, err
    assert "training own:Sequential (" in out and "(stopped)" in out, out  # rank 0's headless lines
    # no token given: rank 0 says so in the API's words, not the command line's (issue 44)
    warning = next(line for line in err.splitlines() if "no job token" in line)
    assert "give every rank the same join(token=...)" in warning and "--token" not in warning, warning
    # rank 0 entered a step after the stop: one line (not lost in torch's "[rank0]:" wrapping of stderr), exit 0
    assert f"ddptop rank 0: stopped by ctl at step {len(json.loads((tmp_path / 'rank0.json').read_text())['losses'])}" \
        in err, err
    mine = {rank: json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)}
    losses = {rank: mine[rank]["losses"] for rank in (0, 1)}
    assert mine[0]["twice"].startswith("UsageError: job.prepare was called twice"), mine[0]
    with sqlite3.connect(str(record)) as db:
        segments = db.execute("SELECT rank, step, json_extract(data, '$.segment'), json_extract(data, '$.fingerprint'), "
                              "json_extract(data, '$.config.strategy') FROM events WHERE kind = 'config_applied' "
                              "ORDER BY rank, step").fetchall()
        steps = {rank: db.execute("SELECT step, loss, segment, fwd_s, bwd_s, comm_bytes FROM steps WHERE rank = ? "
                                  "ORDER BY step", (rank,)).fetchall() for rank in (0, 1)}
        spans = dict(db.execute("SELECT rank, count(*) FROM spans GROUP BY rank").fetchall())
        samples = db.execute("SELECT count(*) FROM system").fetchone()[0]
        memory = db.execute("SELECT rank, segment, min(step), param_bytes, grad_bytes, optim_bytes FROM memory "
                            "GROUP BY rank, segment, param_bytes, grad_bytes, optim_bytes").fetchall()
        # no segment, on any rank, ran (or claimed to run) what the script's loop never applies
        owned = db.execute("SELECT count(*), sum(json_extract(data, '$.config.accum') != 1), "
                           "sum(json_extract(data, '$.config.lr_warmup_steps') != 0), "
                           "sum(json_extract(data, '$.config.compress') != 'none') FROM events "
                           "WHERE kind = 'config_applied'").fetchone()
        finished = {r: (reason, print_) for r, reason, print_ in db.execute(
            "SELECT rank, json_extract(data, '$.reason'), json_extract(data, '$.fingerprint') FROM events "
            "WHERE kind = 'run_finished'")}
    # the switch: at the step ctl was told, the same on both ranks, every rank's model identical as it starts
    # (segment 0 too: allreduce broadcasts nothing itself, so that is prepare's doing)
    per_rank = {rank: [(step, seg, fp, strat) for r, step, seg, fp, strat in segments if r == rank] for rank in (0, 1)}
    assert [s[3] for s in per_rank[0]] == ["allreduce", *SWITCHES], segments
    assert [s[:3] for s in per_rank[0]] == [s[:3] for s in per_rank[1]], segments
    assert owned == (2 * len(per_rank[0]), 0, 0, 0), owned
    assert [s[0] for s in per_rank[0][1:]] == applied, (segments, applied)
    # every step the script ran, with the loss it computed itself
    for rank in (0, 1):
        assert [row[0] for row in steps[rank]] == list(range(len(losses[rank]))), (rank, len(losses[rank]))
        assert all(abs(row[1] - loss) <= 1e-6 * max(1.0, abs(loss)) for row, loss in zip(steps[rank], losses[rank]))
    assert len(losses[0]) == len(losses[1]) and sum(losses[0][-10:]) < sum(losses[0][:10]) / 4, losses[0]
    # phases and collectives as for ddptop's own loop: allreduce sends bytes, single none
    by_segment = {seg: [row for row in steps[0] if row[2] == seg] for seg in range(4)}
    assert all(row[5] > 0 for row in by_segment[0]) and all(row[5] == 0 for row in by_segment[1]), by_segment
    for seg, rows in by_segment.items():  # forward (hooks on the output) and backward (autograd's callbacks)
        assert sorted(r[3] for r in rows)[len(rows) // 2] > 0 and sorted(r[4] for r in rows)[len(rows) // 2] > 0, \
            (seg, [r[3:5] for r in rows if not (r[3] > 0 and r[4] > 0)], len(rows))
    assert spans.get(0, 0) > 0 and spans.get(1, 0) > 0 and samples > 0, (spans, samples)
    # each rank's memory, sampled at each segment's first step: the model's bytes by torch (the script's own
    # architecture), no gradient (its zero_grad runs inside the step) and no state (SGD without momentum)
    size = sum(p.numel() * p.element_size() for p in nn.Sequential(nn.Linear(8, 16), nn.Tanh(),
                                                                    nn.Linear(16, 1)).parameters())
    assert memory == [(rank, seg, step, size, 0, 0) for rank in (0, 1) for seg, (step, *_) in enumerate(per_rank[rank])
                      ], memory
    # the end: stopped, and the final fingerprint is that of the parameters the script saved (hashed here)
    for rank in (0, 1):
        state = torch.load(tmp_path / f"rank{rank}.pt")
        digest = hashlib.sha256(b"".join(t.contiguous().view(torch.uint8).numpy().tobytes()
                                         for t in state.values())).hexdigest()
        assert finished[rank] == ("stopped", digest), (finished, digest)
    assert finished[0][1] == finished[1][1]


def test_join_outside_torchrun_is_one_line_and_exit_2(tmp_path):
    script = tmp_path / "alone.py"
    script.write_text("from ddptop.api import join\njoin()\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "MASTER_", "RANK", "WORLD_SIZE"))}
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60, env=env)
    assert_one_line_error(result, 2, "one rank of a job: run the script under torchrun")
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
