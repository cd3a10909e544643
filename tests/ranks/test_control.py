"""Live reconfiguration on 3 real ranks: every strategy to every other, buckets, batch, async; same step everywhere."""

from __future__ import annotations

import math
import time

import pytest

from ddptop.config import RunConfig, SyncConfig
from ddptop.control import agent as agents
from ddptop.control.client import ControlClient, ControlError
from ddptop.events import ConfigApplied, ControlRefused
from ddptop.events import ModelsDiverged, RunFinished
from jobs import connect, run_job, steps_of
import ports

TOKEN = "test-token-123"
# an Euler circuit of the complete digraph on the four strategies: every ordered pair exactly once
PATH = ["gather-scatter", "single", "allreduce", "single", "ddp", "gather-scatter", "allreduce", "gather-scatter",
        "ddp", "allreduce", "ddp", "single"]
EXTRA = [{"strategy": "ddp", "bucket_mb": 0.01}, {"bucket_mb": 25.0}, {"batch_size": 8, "scale_lr": True},
         {"strategy": "allreduce", "async_op": True}, {"async_op": False}, {"batch_size": 16},
         {"strategy": "single"}]  # ends alone: each rank trains its own shard, so the final models differ
WORLD = 3


@pytest.fixture(scope="module")
def switched():
    port = ports.port()
    answers, refused = [], []

    def script(collected):
        client = _connect(port)
        for changes in [{"strategy": s} for s in PATH] + EXTRA:
            answers.append((changes, client.send("set", changes, timeout_s=60)))
        try:
            ControlClient("127.0.0.1", port, "not-the-token").send("set", {"strategy": "ddp"})
        except ControlError as exc:
            refused.append(str(exc))
        time.sleep(1.0)
        client.send("stop")

    cfg = RunConfig(model="tiny", sync=SyncConfig(strategy="single", batch_size=16, lr=0.05), steps=100000,
                    synthetic_size=960, span_every=5, eval=False, backend="gloo")
    code, events = run_job(cfg, world_size=WORLD, port=port, token=TOKEN, script=script, timeout_s=60)
    return code, events, answers, refused


def _connect(port: int) -> ControlClient:
    return connect(port, TOKEN, 60)


def test_every_switch_lands_on_the_same_step_on_every_rank(switched):
    code, events, answers, _ = switched
    assert code == 0
    assert len(answers) == len(PATH) + len(EXTRA)
    per_rank = {r: [(e.step, e.segment, e.config) for e in events
                    if isinstance(e, ConfigApplied) and e.rank == r and e.request_id > 0]
                for r in range(WORLD)}
    assert len(per_rank[0]) == len(answers)
    assert per_rank[0] == per_rank[1] == per_rank[2]
    assert [a["step"] for _, a in answers] == [step for step, _, _ in per_rank[0]]
    strategies = [config["strategy"] for _, _, config in per_rank[0]]
    assert strategies[:len(PATH)] == PATH
    last = per_rank[0][-2][2]
    assert last == {"strategy": "allreduce", "bucket_mb": 25.0, "async_op": False, "batch_size": 16, "lr": 0.025,
                    "accum": 1, "compress": "none", "lr_warmup_steps": 0, "shard_unit": ""}
    scaled = next(config for _, _, config in per_rank[0] if config["batch_size"] == 8)
    assert scaled["lr"] == pytest.approx(0.025)  # linear scaling: half the batch, half the rate


def test_switches_are_applied_within_two_exchanges_of_being_accepted(switched):
    """The ranks exchange every ~EXCHANGE_EVERY_S of steps (a gap of boundaries rank 0 sets from its step time,
    control/agent.py): a request accepted waits for the next exchange to be handed out, and for the one after to
    be read. The gap bound comes from rank 0's shortest recorded step around the request (its gap uses the mean)."""
    _, events, answers, _ = switched
    took = {d.step: d.iter_s for d in steps_of(events, 0)}
    for _, answer in answers:
        assert answer["state"] == "applied"
        accepted, applied = answer["accepted_step"], answer["step"]
        around = [took[s] for s in range(max(0, accepted - 2 * agents.MAX_GAP), applied + 1) if s in took]
        gap = max(1, min(agents.MAX_GAP, int(agents.EXCHANGE_EVERY_S / max(min(around), 1e-9))))
        assert 0 <= applied - accepted <= 2 * gap + 1, (answer, gap)


def test_each_step_of_each_rank_arrives_once_with_its_segment(switched):
    _, events, _, _ = switched
    boundaries = [(e.step, e.segment) for e in events if isinstance(e, ConfigApplied) and e.rank == 0]
    assert boundaries[0] == (0, 0)  # the configuration the run started with is segment 0
    for rank in range(WORLD):
        steps = steps_of(events, rank)
        numbers = [d.step for d in steps]
        assert numbers == list(range(len(numbers))) and len(numbers) > len(boundaries)
        for done in steps:
            expected = max((seg for step, seg in boundaries if step <= done.step), default=0)
            assert done.segment == expected
            assert math.isfinite(done.loss)
        batch_8 = [d for d in steps if d.batch_size == 8]
        assert batch_8, "the batch size change reached the data loader"
    assert [e.reason for e in events if isinstance(e, RunFinished)] == ["stopped"] * WORLD


def test_a_wrong_token_changes_nothing(switched):
    _, events, answers, refused = switched
    assert refused and "no ddptop job with this token" in refused[0]  # it does not even find the job's keys
    assert not [e for e in events if isinstance(e, ControlRefused)]
    assert len([e for e in events if isinstance(e, ConfigApplied) and e.rank == 0 and e.request_id]) == len(answers)


def test_every_rank_holds_the_same_model_at_every_segment_start(switched):
    """Segments after `single` start from rank 0's state, broadcast; the fingerprints say so, and a run that ends
    under `single` shows that without that broadcast the ranks' models really differ."""
    _, events, _, _ = switched
    starts: dict[int, dict[int, ConfigApplied]] = {}
    for e in events:
        if isinstance(e, ConfigApplied):
            starts.setdefault(e.segment, {})[e.rank] = e
    assert len(starts) == len(PATH) + len(EXTRA) + 1
    for segment, by_rank in sorted(starts.items()):
        assert len(by_rank) == WORLD
        prints = {e.fingerprint for e in by_rank.values()}
        assert len(prints) == 1 and len(next(iter(prints))) == 64, (segment, prints)
        previous = starts.get(segment - 1, {}).get(0)
        rank0 = by_rank[0]
        if previous is not None and previous.config["strategy"] == "single" and rank0.config["strategy"] != "single":
            assert rank0.sync_bytes > 0, "leaving single re-synchronizes the ranks from rank 0"
        elif rank0.config["strategy"] != "ddp":
            assert rank0.sync_bytes == 0
    finals = {e.rank: e.fingerprint for e in events if isinstance(e, RunFinished)}
    assert len(finals) == WORLD and len(set(finals.values())) == WORLD, "under single every rank trained alone"
    assert not [e for e in events if isinstance(e, ModelsDiverged)]
