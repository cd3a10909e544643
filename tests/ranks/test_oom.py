"""A batch that does not fit, on 2 real gloo ranks: a test-only hook (DDPTOP_TEST_MODEL=oom-batch=N) raises
torch.cuda.OutOfMemoryError in one rank's forward, as CUDA would; every rank rolls back at the same step and the
job trains on; a sweep that grows the batch until it does not fit stops there."""

from __future__ import annotations

import os
import time
from contextlib import contextmanager

import pytest

from ddptop.config import RunConfig, SyncConfig
from ddptop.control.client import ControlClient, ControlError
from ddptop.events import ConfigApplied, OutOfMemory, RunFinished, StepDone
from ddptop.metrics import SegmentTable
from jobs import run_job, steps_of
import ports

TOKEN = "oom-token-1"


@contextmanager
def oom_hook(value: str):
    """The ranks are spawned from this process: they inherit the variable."""
    os.environ["DDPTOP_TEST_MODEL"] = value
    try:
        yield
    finally:
        os.environ.pop("DDPTOP_TEST_MODEL", None)


def _connect(port: int) -> ControlClient:
    deadline = time.monotonic() + 60
    while True:
        try:
            client = ControlClient("127.0.0.1", port, TOKEN)
            if client.status()["step"] >= 3:
                return client
        except Exception:
            if time.monotonic() > deadline:
                raise
        time.sleep(0.2)


@pytest.fixture(scope="module")
def live():
    """ddp at batch 16; `set batch_size=32` runs rank 1 out of memory; `set batch_size=24` fits."""
    port, answers = ports.port(), []

    def script(collected):
        client = _connect(port)
        for batch in (32, 24):
            try:
                answers.append(client.send("set", {"batch_size": batch}, timeout_s=60))
            except ControlError as exc:
                answers.append(str(exc))
        deadline = time.monotonic() + 30  # a few steps at batch 24 before stopping
        while client.status()["step"] < answers[-1]["step"] + 4 and time.monotonic() < deadline:
            time.sleep(0.1)
        client.send("stop")

    cfg = RunConfig(model="tiny", sync=SyncConfig(strategy="ddp", batch_size=16, lr=0.05), steps=100000,
                    synthetic_size=960, eval=False, backend="gloo")
    with oom_hook("no-batch-norm,oom-batch=32,oom-rank=1"):
        code, events = run_job(cfg, world_size=2, port=port, token=TOKEN, script=script, timeout_s=60)
    return code, events, answers


def test_every_rank_rolls_back_at_the_same_step_and_trains_on(live):
    code, events, answers = live
    assert code == 0
    refused, applied = answers
    (oom,) = [e for e in events if isinstance(e, OutOfMemory)]
    assert oom.ranks == (1,) and (oom.batch_size, oom.back_to) == (32, 16)
    assert refused == f"rolled back at step {oom.step}: batch 32 does not fit (CUDA out of memory on rank 1): " \
                      "back to batch 16"  # what `ddptop ctl set` prints after "ddptop: "
    switches = {r: [(e.step, e.segment, e.config["batch_size"], e.who.split(" ")[0]) for e in events
                    if isinstance(e, ConfigApplied) and e.rank == r] for r in (0, 1)}
    assert switches[0] == switches[1]
    trial, back, fits = switches[0][1:]
    assert trial[0] == back[0] == oom.step and (trial[2], back[2], back[3]) == (32, 16, "roll-back:")
    assert fits[2] == 24 and applied["state"] == "applied" and applied["step"] == fits[0]
    for rank in (0, 1):
        steps = steps_of(events, rank)
        assert [d.step for d in steps] == list(range(len(steps)))  # the failed step was retried, not skipped
        assert {d.batch_size for d in steps} == {16, 24} and steps[-1].step > fits[0]
        assert [d.batch_size for d in steps if d.step == oom.step] == [16]


def test_the_models_stay_identical(live):
    _, events, _ = live
    finished = [e.fingerprint for e in events if isinstance(e, RunFinished)]
    assert len(finished) == 2 and finished[0] == finished[1]
    for segment in {e.segment for e in events if isinstance(e, ConfigApplied)}:
        prints = {e.rank: e.fingerprint for e in events if isinstance(e, ConfigApplied) and e.segment == segment}
        assert prints[0] == prints[1], segment


def test_both_backends_were_bound_to_the_job_interface_in_every_rank(live):
    """Set before the first process group (the control group included); the master is 127.0.0.1, so: lo."""
    from ddptop.events import RankJoined
    from ddptop.sources.system import loopback_interface

    _, events, _ = live
    joined = [(e.gloo_ifname, e.nccl_ifname) for e in events if isinstance(e, RankJoined)]
    assert joined == [(loopback_interface(), loopback_interface())] * 2


def test_the_trial_step_of_a_batch_that_fits_is_measured_like_any_other(live):
    _, events, answers = live
    for rank in (0, 1):
        (first,) = [d for d in steps_of(events, rank) if d.step == answers[1]["step"]]
        assert first.batch_size == 24 and first.comm_s > 0 and first.comm_bytes > 0  # gradients still averaged


def test_a_sweep_that_grows_the_batch_stops_at_the_first_that_does_not_fit():
    sweep = tuple(SyncConfig(strategy="allreduce", batch_size=b, lr=0.05) for b in (8, 16, 32, 64))
    cfg = RunConfig(model="tiny", sync=sweep[0], sweep=sweep, sweep_warmup=1, sweep_measure=2, sweep_until_oom=True,
                    synthetic_size=640, eval=False, backend="gloo", profile="test")
    with oom_hook("oom-batch=32"):  # every rank runs out
        code, events = run_job(cfg, world_size=2, timeout_s=60)
    assert code == 0
    (oom,) = [e for e in events if isinstance(e, OutOfMemory)]
    assert (oom.step, oom.batch_size, oom.back_to, oom.ranks) == (6, 32, 0, (0, 1))
    assert "the sweep stops growing the batch here" in oom.describe()
    finished = [e for e in events if isinstance(e, RunFinished)]
    assert [(f.steps, f.reason) for f in finished] == [(6, "done")] * 2 and finished[0].fingerprint == \
        finished[1].fingerprint
    table = SegmentTable.of(events, warmup=1).segments()
    # 1 warm-up step, then a sampled step (left out of times) and one measured; 640 images / 2 ranks / batch
    assert [(s.config["batch_size"], s.measured_steps, s.steps_per_epoch) for s in table] == [(8, 1, 40), (16, 1, 20)]
    assert all(s.epoch_s == pytest.approx(s.slowest.step_s * s.steps_per_epoch) and s.epoch_s > 0 for s in table)
    assert not [d for d in steps_of(events) if d.batch_size >= 32]
    assert isinstance(steps_of(events)[0], StepDone)


def test_the_roll_back_is_a_headless_line_and_a_recorded_event():
    import io

    from ddptop.front.headless import HeadlessPrinter
    from ddptop.record import schema

    event = OutOfMemory(0, 12, 3, 64, 32, (1, 2), 1.0)
    out = io.StringIO()
    HeadlessPrinter(out=out, bar=False).handle([event])
    assert out.getvalue() == "step 12: batch 64 does not fit (CUDA out of memory on ranks 1, 2): back to batch 32\n"
    table, row = schema.encode(event, 1, 1.0)
    data = row[6]  # read back as SELECT gives it: seq, at, data
    assert table == "events" and schema.decode_row("events", (1, 1.0, data)) == event
    with pytest.raises(schema.EventDecodeError):
        schema.decode_row("events", (1, 1.0, data.replace("[1,2]", '["x"]')))


def test_the_hpml_lab4_q1_profile_grows_the_batch_4x_on_one_gpu_until_it_does_not_fit():
    from ddptop.cli.run import config_from_args, parse_run_args

    args, profile = parse_run_args(["--profile", "hpml-lab4-q1"])
    cfg = config_from_args(args, profile)
    batches = [s.batch_size for s in cfg.sweep]
    assert cfg.sweep_until_oom and batches[:3] == [32, 128, 512] and all(b * 4 == n for b, n in zip(batches, batches[1:]))
    assert (args.local, cfg.backend, cfg.model) == (1, "nccl", "resnet18")
    assert cfg.synthetic_size >= batches[-1]  # the largest batch is limited by memory, never by the data
