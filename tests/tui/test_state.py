"""SessionState: the reducer over a real job's events and over hand-made edge cases."""

from __future__ import annotations

import subprocess
import sys

import pytest

from ddptop.events import ConfigApplied, ControlRefused, RankLost, RunState
from ddptop.events import EpochDone, GpuStat, NicStat, RankJoined, RunFinished, RunStarted, StepDone, SystemSample
from ddptop.state import session as session_mod
from ddptop.metrics.expected import expected_bytes
from ddptop.state.session import SessionState
from ddptop.tui.render.tables import node_memory_line


def _step(rank, step, iter_s=0.1, loss=1.0, segment=0, tx=100, rx=100, comm_s=0.02):
    return StepDone(rank, step, 0, segment, 1000.0 + step, iter_s, 0.01, 0.05, comm_s, 0.01, 0.5, 16, loss, 100,
                    tx, rx, False)


def _run(world=2, strategy="ddp", param_bytes=1000):
    return RunStarted("tiny", "synthetic", world, strategy, 25.0, False, 16, 0.1, 250, param_bytes, 4, (), 20, 999.0)


def _nic(iface, tx_bytes, rate=10.0):
    return NicStat(iface, rate, rate, tx_bytes, tx_bytes, 5, 5, 0, 1, 0, 0, rate * 2, rate * 2)


def _sample(rank, host, tx_bytes, t=1000.0, gpus=()):
    return SystemSample(rank, host, t, 50.0, 60.0, 1000, 2000, 4000, "eth0",
                        (_nic("eth0", tx_bytes), _nic("lo", 0)), gpus, "ok" if gpus else "not available")


def test_fixture_run_reduces_to_the_jobs_final_state(events):
    state = SessionState()
    state.apply_all(events)
    snap = state.snapshot()
    assert snap.world_size == 2 and snap.run.model == "tiny"
    assert snap.step == 400 and snap.finished
    assert [r.state for r in snap.ranks] == ["done", "done"]
    assert [s.index for s in snap.segments] == [0, 1, 2, 3]
    assert [s.config["strategy"] for s in snap.segments] == ["allreduce", "ddp", "gather-scatter", "allreduce"]
    assert snap.segments[0].who == "start"
    assert len(snap.evals) == 10 and snap.evals[-1].step == 400
    assert snap.spans.steps(0)[-1] == 399
    assert snap.rank_source == "local" and snap.hosts == ("vm",)
    assert len(snap.mean_loss()) == 400
    node = snap.nodes[0]
    assert node.ranks == (0, 1) and node.job_iface == "lo" and node.nic().per_step_tx > 0


def test_snapshot_is_reused_until_an_event_changes_it():
    state = SessionState()
    state.apply(_step(0, 0))
    first = state.snapshot()
    assert state.snapshot() is first
    state.apply(_step(0, 1))
    assert state.snapshot() is not first and state.snapshot().step == 2


def test_slowest_running_rank_is_marked_and_states_follow_the_events():
    state = SessionState()
    state.apply_all([_step(0, 3, iter_s=0.1), _step(1, 3, iter_s=0.3), _step(2, 3, iter_s=0.2)])
    assert [r.slowest for r in state.snapshot().ranks] == [False, True, False]
    state.apply(RankLost(1, 3, "no heartbeat for 10 s", 1010.0))
    ranks = state.snapshot().ranks
    assert ranks[1].state == "lost" and [r.slowest for r in ranks] == [False, False, True]
    state.apply(RunState(0, 4, True, 1011.0))
    assert state.snapshot().paused and state.snapshot().ranks[0].state == "paused"
    state.apply(RunState(0, 4, False, 1012.0))
    assert not state.snapshot().paused and state.snapshot().ranks[0].state == "running"
    state.apply(RunFinished(2, 4, "error: boom", 1013.0))
    assert state.snapshot().ranks[2].state == "error"
    assert any("rank 1 lost" in n for n in state.snapshot().notices)


def test_only_rank_zeros_config_applied_makes_segments_and_refusals_become_notices():
    state = SessionState()
    state.apply(_run())
    assert state.snapshot().config["strategy"] == "ddp"  # before any ConfigApplied: what the run started with
    state.apply(ConfigApplied(1, 5, 1, {"strategy": "allreduce"}, 1, "ctl", 1.0))
    assert state.snapshot().segments == ()
    state.apply(ConfigApplied(0, 5, 1, {"strategy": "allreduce", "batch_size": 16}, 1, "ctl@h:1", 1.0))
    snap = state.snapshot()
    assert snap.config["strategy"] == "allreduce" and snap.segments[0].step == 5
    state.apply(ControlRefused(2, "bad MAC: wrong token or altered message", 2.0))
    assert "request 2 refused: bad MAC" in state.snapshot().notices[-1]


def test_histories_are_bounded(monkeypatch):
    monkeypatch.setattr(session_mod, "STEP_HISTORY", 5)
    state = SessionState()
    state.apply_all(_step(0, s) for s in range(12))
    assert [d.step for d in state.snapshot().history[0]] == [7, 8, 9, 10, 11]


def test_eval_points_sum_every_ranks_shard():
    state = SessionState()
    state.apply_all([EpochDone(0, 0, 20, 1.0, 30, 50, 1.0), EpochDone(1, 0, 20, 3.0, 10, 50, 1.0)])
    point = state.snapshot().evals[0]
    assert (point.correct, point.total, point.accuracy) == (40, 100, 0.4)
    assert point.test_loss == pytest.approx(2.0)


def test_nodes_count_one_reporter_per_host_and_bytes_per_step_from_counter_deltas():
    state = SessionState()
    state.apply_all([RankJoined(r, 3, h, 1, "cpu", "gloo", 1, "2", "0.1", "flags", 0.0)
                     for r, h in ((0, "a"), (1, "a"), (2, "b"))])
    state.apply_all([_run(world=3), _step(0, 9), _sample(0, "a", 1000), _sample(1, "a", 999999)])
    state.apply_all([_step(0, 19), _sample(0, "a", 6000, t=1001.0), _sample(2, "b", 10)])
    nodes = state.snapshot().nodes
    assert [n.host for n in nodes] == ["a", "b"] and nodes[0].ranks == (0, 1)
    eth = nodes[0].nic("eth0")
    assert len(eth.tx_history) == 2  # rank 1's sample of the same host was not counted again
    assert eth.per_step_tx == pytest.approx(500.0)  # 5000 bytes over 10 steps
    assert sorted(nodes[0].nics) == ["eth0", "lo"]
    assert (nodes[0].expected_tx, nodes[1].expected_tx) == (2 * 1333, 1333)  # ring: 2(N−1)/N·S per rank


def test_gpu_percent_is_none_without_a_gpu_and_averaged_with_them():
    state = SessionState()
    state.apply(_sample(0, "a", 0))
    gpus = (GpuStat(0, "H100", 80.0, 1, 2, 300.0, 60.0), GpuStat(1, "H100", None, 1, 2, None, None))
    state.apply(_sample(1, "a", 0, gpus=gpus))
    ranks = state.snapshot().ranks
    assert ranks[0].gpu_percent is None and ranks[1].gpu_percent == 80.0
    assert state.snapshot().util[1].power == (300.0,)


@pytest.mark.parametrize("strategy,rank,expected", [
    ("single", 0, (0, 0)), ("allreduce", 1, (1500, 1500)), ("ddp", 0, (1500, 1500)),
    ("gather-scatter", 0, (3000, 3000)), ("gather-scatter", 2, (1000, 1000)),
])
def test_expected_bytes_follow_the_wire_formulas(strategy, rank, expected):
    assert expected_bytes(_run(world=4, param_bytes=1000), {"strategy": strategy}, rank) == expected


def test_state_imports_neither_textual_nor_torch():
    code = ("import sys, ddptop.state.session, ddptop.metrics.expected; "
            "bad = [m for m in ('textual', 'torch') if m in sys.modules]; print(bad); sys.exit(1 if bad else 0)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_node_cpu_line_says_when_it_is_a_share_of_the_nodes_cpu_quota():
    """A lab node's sample carries its cgroup's quota: the line names it; a plain node's line stays as it was."""
    state = SessionState()
    plain = _sample(0, "node0", 10)
    lab = SystemSample(1, "node1", 1000.0, 50.0, 98.0, 1000, 2000, 4000, "eth0", (), (), "not available", 0.67)
    state.apply_all([_run(), plain, lab])
    lines = node_memory_line(state.snapshot()).plain.split("\n")
    assert lines[0].startswith("node0          node CPU ") and "quota" not in lines[0]
    assert lines[1].startswith("node1          node CPU (of its 0.67-core quota) ") and "98" in lines[1]
