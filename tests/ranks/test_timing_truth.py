"""Timings against things ddptop did not compute: a delay the test injects into the forward pass, and the wall
clock. (Shaped links and NIC counters: tests/lab/.)"""

from __future__ import annotations

import statistics

import pytest

from ddptop.config import RunConfig, SyncConfig
from jobs import run_job, steps_of

DELAY_S = 0.1
PER = 16  # steps per strategy
WARMUP = 3


def sweep_job(delay_ms: int, monkeypatch) -> list:
    if delay_ms:
        monkeypatch.setenv("DDPTOP_TEST_MODEL", f"sleep-ms={delay_ms}")
    sweep = (SyncConfig(strategy="allreduce", batch_size=16), SyncConfig(strategy="ddp", batch_size=16))
    cfg = RunConfig(model="tiny", sync=sweep[0], sweep=sweep, sweep_warmup=0, sweep_measure=PER, span_every=5,
                    synthetic_size=1280, eval=False, profile="truth")
    code, events = run_job(cfg, world_size=2, timeout_s=60)
    monkeypatch.delenv("DDPTOP_TEST_MODEL", raising=False)
    assert code == 0
    return events


@pytest.fixture(scope="module")
def runs():
    mp = pytest.MonkeyPatch()
    try:
        return {0: sweep_job(0, mp), 1: sweep_job(int(DELAY_S * 1000), mp)}
    finally:
        mp.undo()


def medians(events, segment: int) -> dict[str, float]:
    steps = [d for d in steps_of(events) if d.segment == segment and not d.sampled and d.step >= segment * PER + WARMUP]
    return {k: statistics.median(getattr(d, k) for d in steps)
            for k in ("iter_s", "compute_s", "fwd_s", "comm_s", "data_s", "own_s")}


@pytest.mark.parametrize("segment,strategy", [(0, "allreduce"), (1, "ddp")])
def test_an_injected_forward_delay_shows_up_in_compute_not_in_communication(runs, segment, strategy):
    plain, slow = medians(runs[0], segment), medians(runs[1], segment)
    added = {k: slow[k] - plain[k] for k in plain}
    assert 0.9 * DELAY_S <= added["compute_s"] <= 1.3 * DELAY_S, added
    assert 0.9 * DELAY_S <= added["fwd_s"] <= 1.3 * DELAY_S, added
    # the step grows by the delay; communication may take a little more too (waiting for a peer that slept a
    # little longer: skew on this 2-core machine), never the delay itself
    # (or a little less by what the waiting shrank: a fresh-clone run saw compute +99 ms, comm −4.8 ms, the step +89.7)
    assert 0.9 * DELAY_S - abs(added["comm_s"]) <= added["iter_s"] <= 1.5 * DELAY_S, added
    assert abs(added["comm_s"]) < 0.3 * DELAY_S and abs(added["data_s"]) < 0.1 * DELAY_S, added


def test_step_times_add_up_to_the_wall_clock(runs):
    """Within a segment (no switch, no pause, no test pass), the step times of steps k+1..m sum to the wall-clock
    time between the ends of steps k and m: nothing the training thread does falls between two steps."""
    for events in runs.values():
        for rank in (0, 1):
            for segment in (0, 1):
                steps = [d for d in steps_of(events, rank) if d.segment == segment]
                wall = steps[-1].t - steps[0].t
                counted = sum(d.iter_s for d in steps[1:])
                assert counted == pytest.approx(wall, rel=0.02), (rank, segment, counted, wall)
