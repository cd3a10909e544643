"""ddptop.metrics.tune, pure: the sizes a tune tries, the steps it measures, the size it keeps."""

from __future__ import annotations

import pytest

from ddptop.events import StepDone, TuneTrial
from ddptop.metrics import tune


def _row(mb, step_s, world=2, link=None, strategy="ddp"):
    return {"strategy": strategy, "bucket_mb": mb if strategy == "ddp" else None, "async_op": False,
            "world_size": world, "link": link, "step_s": step_s}


def test_candidates_are_the_fastest_other_ddp_sizes_on_the_runs_own_world_and_link_at_most_five():
    rows = [_row(25.0, 0.5), _row(1.0, 0.9), _row(5.0, 0.4), _row(10.0, 0.4), _row(50.0, 0.45), _row(100.0, 0.6),
            _row(5.0, 0.1, world=8), _row(1.0, 0.1, link="unlimited"), _row(None, 0.05, strategy="allreduce")]
    assert tune.candidates(rows, 2, 25.0, 3) == [5.0, 10.0, 50.0]  # ties by size; 25 MB is in force
    assert tune.candidates(rows, 2, 25.0, 9) == [5.0, 10.0, 50.0, 100.0, 1.0]  # never more than MAX_TRIALS


def _step(rank, step, iter_s, segment=1, sampled=False):
    return StepDone(rank=rank, step=step, epoch=0, segment=segment, t=0.0, iter_s=iter_s, data_s=0.0, compute_s=0.0,
                    comm_s=0.0, exposed_comm_s=0.0, overlap=0.0, batch_size=8, loss=1.0, comm_bytes=0, tx_bytes=0,
                    rx_bytes=0, sampled=sampled)


def test_a_trial_is_the_slowest_ranks_mean_over_its_window_once_every_rank_has_every_step():
    history = {0: [_step(0, s, 0.1) for s in range(10, 14)], 1: [_step(1, s, 0.2) for s in range(10, 13)]}
    assert tune.measure(history, 2, 1, 11, 13) is None  # rank 1 has not reported step 13
    history[1].append(_step(1, 13, 0.4))
    history[1].append(_step(1, 14, 9.0))  # outside the window
    assert abs(tune.measure(history, 2, 1, 11, 13) - (0.2 + 0.2 + 0.4) / 3) < 1e-12
    assert tune.trial_steps(10, 1, 3) == (11, 13)
    assert tune.start_steps(history, 1, 10, 1, 3) == (11, 13) and tune.start_steps(history, 1, 10, 1, 4) is None


def test_the_kept_size_is_the_fastest_and_a_tie_keeps_the_start():
    start = TuneTrial(0, 25.0, 1, 20, 0.5)
    assert tune.kept(start, [TuneTrial(1, 5.0, 22, 41, 0.4), TuneTrial(2, 10.0, 43, 62, 0.45)]).bucket_mb == 5.0
    assert tune.kept(start, [TuneTrial(1, 5.0, 22, 41, 0.5)]) is start
    # faster, but by less than MIN_GAIN: the size in force stays
    assert tune.kept(start, [TuneTrial(1, 5.0, 22, 41, 0.5 * (1 - tune.MIN_GAIN / 2))]) is start
    assert tune.kept(start, [TuneTrial(1, 5.0, 22, 41, 0.5 * (1 - 2 * tune.MIN_GAIN))]).bucket_mb == 5.0


def test_a_gain_within_the_two_measurements_noise_keeps_the_start():
    """5% faster, but each 20-step mean ±10 ms (standard error): the difference's is 14.1 ms, and 2 of them (28 ms)
    exceed the 25 ms gained; with ±5 ms each (14.1 ms needed) the same 25 ms is kept."""
    noisy_start, quiet_start = TuneTrial(0, 25.0, 1, 20, 0.5, 0.010), TuneTrial(0, 25.0, 1, 20, 0.5, 0.005)
    assert tune.margin(noisy_start, TuneTrial(1, 5.0, 22, 41, 0.475, 0.010)) == pytest.approx(2 * 0.010 * 2 ** 0.5)
    assert tune.kept(noisy_start, [TuneTrial(1, 5.0, 22, 41, 0.475, 0.010)]) is noisy_start
    assert tune.kept(quiet_start, [TuneTrial(1, 5.0, 22, 41, 0.475, 0.005)]).bucket_mb == 5.0


def test_a_trials_spread_is_its_slowest_ranks_standard_error():
    history = {0: [_step(0, s, 0.1) for s in range(10, 14)],
               1: [_step(1, s, t) for s, t in zip(range(10, 14), (9.0, 0.2, 0.3, 0.4))]}
    mean, se = tune.measured(history, 2, 1, 11, 13)
    assert mean == pytest.approx(0.3) and se == pytest.approx(0.1 / 3 ** 0.5)  # stdev of .2 .3 .4 is 0.1
    assert tune.measured({0: history[0], 1: history[1][:3]}, 2, 1, 11, 13) is None


def test_the_measurements_walk_on_toward_the_faster_side_within_five_trials():
    """The CI lab run (2026-11-27) in which the model's three (10, 50, 100 MB from 25 MB) missed the fastest sizes:
    its measured s/step, then what the walk would have met (SQL on that job: 5 MB 0.578, 1 MB 0.581)."""
    rows = [_row(mb, 0.5) for mb in (1.0, 5.0, 10.0, 25.0, 50.0, 100.0)] + [_row(5.0, 0.1, world=8)]
    grid = tune.ddp_sizes(rows, 2)
    assert grid == [1.0, 5.0, 10.0, 25.0, 50.0, 100.0]
    seen = {25.0: 0.6178, 10.0: 0.6007, 50.0: 0.6611, 100.0: 0.6679}
    assert tune.next_size(grid, seen) == 5.0  # 10 MB is the fastest and the smallest measured: one size down
    seen[5.0] = 0.5784
    assert tune.next_size(grid, seen) == 1.0
    seen[1.0] = 0.5815
    assert tune.next_size(grid, seen) is None  # 5 MB is fastest with both neighbours measured: the walk ends
    start = TuneTrial(0, 25.0, 1, 20, 0.6178, 0.0063)
    trials = [TuneTrial(i, mb, 1, 20, s, 0.01) for i, (mb, s) in enumerate(seen.items()) if mb != 25.0]
    assert len(trials) == 5 and tune.kept(start, trials).bucket_mb == 5.0


def test_the_walk_goes_up_when_the_largest_is_fastest_and_stops_at_the_grids_end():
    grid = [1.0, 5.0, 10.0, 25.0, 50.0, 100.0]
    assert tune.next_size(grid, {25.0: 0.6, 10.0: 0.7, 50.0: 0.5}) == 100.0
    assert tune.next_size(grid, {25.0: 0.6, 50.0: 0.7, 100.0: 0.5}) is None  # nothing larger left
    assert tune.next_size(grid, {25.0: 0.5, 10.0: 0.7, 50.0: 0.7}) is None  # the start, between two slower
    assert tune.next_size(grid, {1.0: 0.4, 5.0: 0.5}) is None  # the smallest of the grid is fastest
    assert tune.next_size(grid, {}) is None


def test_a_segment_the_tune_did_not_start_as_its_own_trial_is_foreign():
    """The tune's own trials: asked by the tuner, the start's configuration but for bucket_mb. A `set` between two
    trials shows as the next trial carrying its change (batch 32 under 10 MB's label), or as a segment of its own;
    during a pause the tuner's request merges into the user's (the user's `who`)."""
    from ddptop.state.views import Segment

    base = {"strategy": "ddp", "bucket_mb": 25.0, "batch_size": 64, "lr": 0.1, "accum": 1, "compress": "none"}
    tuner = "tune@host:7"

    def seg(index, who, **changes):
        return Segment(index, index * 30, {**base, **changes}, who, 0.0)

    # the start is segment 1 (a user's batch 32): what came before it is no part of the tune
    before = [seg(0, "run"), seg(1, "ctl@host:9", batch_size=32)]
    assert tune.foreign([*before, seg(2, tuner, bucket_mb=5.0, batch_size=32)], 1, tuner, before[1].config) is None
    trials = [seg(2, tuner, bucket_mb=5.0), seg(3, tuner, bucket_mb=10.0)]
    assert tune.foreign([before[0], *trials], 0, tuner, base) is None
    carried = seg(4, tuner, bucket_mb=1.0, batch_size=32)  # a set between trials 3 and 4, carried by the tune's
    assert tune.foreign([*trials, carried], 0, tuner, base) is carried
    own = seg(4, "ctl@host:9", compress="fp16")
    assert tune.foreign([*trials, own, seg(5, tuner, bucket_mb=1.0, compress="fp16")], 0, tuner, base) is own
    merged = seg(4, "ctl@host:9", bucket_mb=1.0)  # the same configuration, asked by someone else
    assert tune.foreign([*trials, merged], 0, tuner, base) is merged


def test_a_strategy_tunes_trials_vary_the_strategy_only():
    """`tune strategy`'s own trials: the start's configuration but for the strategy (and what a switch turns off on
    the way: async_op leaving allreduce); a bucket size changed on the way is another client's."""
    from ddptop.state.views import Segment

    base = {"strategy": "allreduce", "bucket_mb": 25.0, "batch_size": 64, "async_op": True, "compress": "none"}
    tuner = "tune@host:7"
    trials = [Segment(i, i * 30, {**base, "strategy": s, "async_op": False}, tuner, 0.0)
              for i, s in enumerate(tune.strategies("allreduce"), start=1)]
    assert [s.config["strategy"] for s in trials] == ["ddp", "zero1", "zero2", "zero3"]
    assert tune.strategies("zero1") == ["ddp", "zero2", "zero3"]
    assert tune.foreign(trials, 0, tuner, base, "strategy") is None
    assert tune.foreign(trials, 0, tuner, base, "bucket") is trials[0]  # a bucket tune's trial never switches
    resized = Segment(5, 150, {**base, "strategy": "zero1", "bucket_mb": 5.0}, tuner, 0.0)
    assert tune.foreign([*trials, resized], 0, tuner, base, "strategy") is resized


def test_a_trials_memory_is_the_rank_holding_most_and_the_largest_peak_once_every_rank_sampled():
    from ddptop.metrics.memory import RankMemory

    def row(rank, segment, params, peak):
        return RankMemory(segment, rank, 1, 3, params, 100, 10, peak, peak, 0, "process USS", 0.0)

    rows = [row(0, 2, 1000, 5000), row(0, 3, 400, 9000)]
    assert tune.memory(rows, 3, 2) is None  # rank 1 has no sample of segment 3 yet
    rows.append(row(1, 3, 600, 7000))
    assert tune.memory(rows, 3, 2) == (600 + 110, 9000)


@pytest.mark.parametrize("what, strategy, said", [
    ("bucket", "ddp", ""), ("bucket", "zero1", ""), ("strategy", "zero3", ""), ("strategy", "allreduce", ""),
    ("bucket", "zero2", "tune bucket tunes DDP's buckets; zero2 has none (FSDP2 shards by unit): ddptop ctl tune "
                        "strategy tries ddp, zero1, zero2 and zero3"),
    ("bucket", "allreduce", "tune bucket tunes DDP's buckets; the job runs allreduce (ddptop ctl set strategy=ddp "
                            "first)"),
    ("strategy", "single", "tune strategy compares strategies that synchronize the ranks; the job runs single "
                           "(ddptop ctl set strategy=ddp first)"),
    ("lr", "ddp", "tune: say what to tune: bucket or strategy, not 'lr'"),
])
def test_rank_0_refuses_a_tune_with_nothing_to_tune_in_one_line(what, strategy, said):
    from ddptop.control.commands import tune_refusal
    from ddptop.errors import UsageError

    if not said:
        tune_refusal(what, strategy)
        return
    with pytest.raises(UsageError) as err:
        tune_refusal(what, strategy)
    assert str(err.value) == said
