"""Probes on real gloo ranks started by ddptop's front process: spans, comm per parameter or bucket, bytes, overlap."""

from __future__ import annotations

import dataclasses
import statistics

import pytest

from ddptop.config import SyncConfig
from ddptop.events import RunStarted, SystemSample
from ddptop.train.models import build_model
from jobs import run_job, spans_of, steps_of, tiny_config

EPS = 1e-6
PARTS_EPS = 2e-5  # 20 µs
# `other`'s share of the median step: 0.9% in recordings/live-switch.db (tiny model, 2 ranks, 3000 steps; SQL:
# median of (iter_s − data_s − compute_s − exposed_comm_s − own_s) / iter_s; 0.35-1.3% by segment)
OTHER_SHARE = 0.05
TINY_PARAMS = [(n, p.numel() * p.element_size()) for n, p in build_model("tiny").named_parameters()]
TINY_BYTES = sum(size for _, size in TINY_PARAMS)


SEGMENTS = {  # one job sweeping the four configurations the tests below read, PER steps each
    "allreduce": SyncConfig(strategy="allreduce", batch_size=16),
    "async": SyncConfig(strategy="allreduce", async_op=True, batch_size=16),
    "gather-scatter": SyncConfig(strategy="gather-scatter", batch_size=16),
    "ddp-big-bucket": SyncConfig(strategy="ddp", bucket_mb=100, batch_size=16),
}
PER = 4


@pytest.fixture(scope="module")
def run():
    """Every event of one real 2-rank job whose sweep runs each configuration of SEGMENTS for PER steps, every step
    sampled: one job where four took four starts of the ranks (the tests only read it; each segment starts as a
    run's first segment does, tests/ranks/test_matrix.py)."""
    sweep = tuple(SEGMENTS.values())
    cfg = tiny_config().replace(sync=sweep[0], sweep=sweep, sweep_warmup=0, sweep_measure=PER)
    code, events = run_job(cfg)
    assert code == 0
    return events


@pytest.fixture(scope="module")
def jobs(run):
    """name → the events of its segment (steps, spans, samples: each carries its segment), steps numbered from 0 in
    each, as four jobs of PER steps would have them."""
    out = {}
    for index, name in enumerate(SEGMENTS):
        mine = [e for e in run if getattr(e, "segment", None) == index]
        first = min(e.step for e in mine if hasattr(e, "step"))
        assert first == index * PER, (name, first)
        out[name] = [dataclasses.replace(e, step=e.step - first) if hasattr(e, "step") else e for e in mine]
    return out


@pytest.mark.parametrize("name", ["allreduce", "async", "gather-scatter", "ddp-big-bucket"])
def test_spans_are_well_nested_and_ordered(jobs, name):
    sampled = spans_of(jobs[name])
    # 4 steps x 2 ranks, span_every=1: every step but the segment's first (DDP's first has one bucket for all)
    assert sorted((s.rank, s.step) for s in sampled) == [(r, k) for r in (0, 1) for k in (1, 2, 3)]
    assert sorted(d.step for d in steps_of(jobs[name]) if d.sampled) == [1, 1, 2, 2, 3, 3]
    for step in sampled:
        done = next(d for d in steps_of(jobs[name], step.rank) if d.step == step.step)
        spans = step.spans
        assert all(s.start_s >= -EPS and s.dur_s >= 0 and s.end_s <= done.iter_s + EPS for s in spans)
        fwd = [s for s in spans if s.kind == "fwd"]
        bwd = [s for s in spans if s.kind == "bwd"]
        opt = [s for s in spans if s.kind == "opt"]
        data = [s for s in spans if s.kind == "data"]
        assert len(data) == 1 and len(opt) == 1
        assert {s.name for s in fwd} >= {"features.0", "classifier"}  # users find layers by module name
        for a, b in zip(fwd, fwd[1:]):  # leaf layers run one after another
            assert a.end_s <= b.start_s + EPS
        assert data[0].end_s <= fwd[0].start_s + EPS
        assert max(s.end_s for s in fwd) <= min(s.start_s for s in bwd) + EPS
        assert opt[0].start_s >= max(s.end_s for s in bwd) - EPS
        # backward visits layers in reverse: the classifier's gradient comes first
        assert bwd[0].name == "classifier"


@pytest.mark.parametrize("name,per_param", [("allreduce", 1), ("async", 1), ("gather-scatter", 2)])
def test_a_comm_span_for_every_parameter(jobs, name, per_param):
    for step in spans_of(jobs[name]):
        comm = [s for s in step.spans if s.kind == "comm"]
        assert len(comm) == per_param * len(TINY_PARAMS)
        for pname, size in TINY_PARAMS:
            mine = [s for s in comm if s.name.endswith(" " + pname)]
            assert len(mine) == per_param and all(s.nbytes == size for s in mine)


def test_async_waits_are_recorded(jobs):
    for step in spans_of(jobs["async"]):
        assert [s.name for s in step.spans if s.kind == "wait"] == ["wait async handles"]


def ring_bytes(tensors: list[int], world_size: int) -> int:
    """What one rank sends (and receives) in a ring all-reduce of each tensor, written out here rather than taken
    from ddptop.metrics.wire: the tensor in N chunks of S/N bytes; N−1 chunks go out in the reduce-scatter and N−1
    in the all-gather, so 2(N−1)·S/N per tensor (rounded down to whole bytes, as gloo's chunks are)."""
    return sum(2 * (world_size - 1) * size // world_size for size in tensors)


@pytest.mark.parametrize("name, tensors", [("allreduce", [size for _, size in TINY_PARAMS]),
                                           ("async", [size for _, size in TINY_PARAMS]),
                                           ("ddp-big-bucket", [TINY_BYTES])])  # one bucket: one tensor of them all
def test_ring_bytes_per_step(jobs, name, tensors):
    """Against the model's own parameter bytes (numel × element_size, summed by the test) through the ring's
    arithmetic: with 2 ranks each rank sends and receives exactly S a step."""
    expected = ring_bytes(tensors, 2)
    assert expected == TINY_BYTES  # N = 2: 2(N−1)/N = 1, every tensor's bytes once
    steps = steps_of(jobs[name])
    assert len(steps) == 8  # 4 steps × 2 ranks: none may pass unchecked
    for done in steps:
        assert done.comm_bytes == TINY_BYTES
        assert (done.tx_bytes, done.rx_bytes) == (expected, expected), done


def test_gather_scatter_bytes_per_step(jobs):
    for done in steps_of(jobs["gather-scatter"]):
        assert done.comm_bytes == 2 * TINY_BYTES  # each parameter is gathered and scattered
        # N=2: root receives (N-1)S and sends (N-1)S; the other rank sends S and receives S
        assert done.tx_bytes == TINY_BYTES and done.rx_bytes == TINY_BYTES


def test_bucket_larger_than_the_model_is_one_bucket(jobs):
    for step in spans_of(jobs["ddp-big-bucket"]):
        comm = [s for s in step.spans if s.kind == "comm"]
        assert [s.name for s in comm] == ["bucket 0"] and comm[0].nbytes == TINY_BYTES


def test_step_summary_is_consistent(run, jobs):
    started = [e for e in run if isinstance(e, RunStarted)]
    assert len(started) == 1 and started[0].param_bytes == TINY_BYTES
    for name, events in jobs.items():
        for done in steps_of(events):
            assert done.iter_s > 0 and 0 <= done.overlap <= 1
            assert done.comm_s > 0 and 0 <= done.exposed_comm_s <= done.comm_s + EPS
            assert done.compute_s <= done.iter_s + EPS
            assert done.batch_size == 16
            assert done.own_s > 0  # the boundary exchange and the marks, at least
            # the measured parts, summed raw (not through `other`, which is clamped at 0), never exceed the step:
            # a part counted twice (ddptop's bookkeeping inside an async collective's span was own AND exposed
            # time, 0.4 ms over a 13 ms step) shows here. PARTS_EPS: float sums of a few perf_counter differences
            measured = done.data_s + done.fwd_s + done.bwd_s + done.opt_s + done.exposed_comm_s + done.own_s
            assert measured <= done.iter_s + PARTS_EPS, (name, done)
        # ... and leave little unexplained: `other` (zero_grad, the loop between phases) is ~1% of a tiny-model step
        # in recordings/live-switch.db (SQL: OTHER_SHARE's comment). A share of the step, not a time: a slower
        # machine slows the parts and the step alike. The median step, so one step preempted in the loop (its wait
        # lands in `other`) does not decide it; OTHER_SHARE is 5x the recording's share
        steps = steps_of(events)
        assert len(steps) >= 8, name
        shares = sorted((d.iter_s - d.data_s - d.compute_s - d.exposed_comm_s - d.own_s) / d.iter_s for d in steps)
        print(name, "other / step:", " ".join(f"{x:.1%}" for x in shares))
        assert statistics.median(shares) < OTHER_SHARE, (name, shares)


def test_async_bookkeeping_is_not_counted_as_exposed_communication_too():
    """allreduce async_op: the bookkeeping after each wait ran while the next collective was in flight, so it was
    both ddptop's own time and exposed communication; 53 of 600 steps then added up to more than the step (by up to
    3.4 ms); after the fix 0 of 600 at load ~5, but a quiet CI run of this test found 1 of 120 over by 3.9 ms (cause
    not found: the next person's). 60 steps × 2 ranks of the tiny model: at most 2 steps over (the old code: ~11)."""
    code, events = run_job(tiny_config(strategy="allreduce", async_op=True, steps=60, span_every=1000), timeout_s=60)
    assert code == 0
    over = [(d.rank, d.step, d.data_s + d.compute_s + d.exposed_comm_s + d.own_s - d.iter_s) for d in steps_of(events)
            if d.data_s + d.compute_s + d.exposed_comm_s + d.own_s > d.iter_s + PARTS_EPS]
    assert len(steps_of(events)) == 120 and len(over) <= 2, over


def test_system_samples_arrive_from_every_rank(run):
    samples = [e for e in run if isinstance(e, SystemSample)]
    assert {s.rank for s in samples} == {0, 1}
    assert all(s.job_iface == "lo" and s.nic() is not None for s in samples)


def test_ddp_small_buckets_overlap_the_backward_pass():
    """VGG-11 with 1 MB buckets: several buckets (a tensor over the cap gets its own; VGG's 9.4 MB conv weights
    make 7), and some go out while backward still computes."""
    cfg = tiny_config(strategy="ddp", bucket_mb=1, model="vgg11", steps=3, batch_size=8)
    code, events = run_job(cfg, timeout_s=60)
    assert code == 0
    for step in spans_of(events):
        if step.step == 0:
            continue  # DDP rebuilds its buckets after the first step
        comm = [s for s in step.spans if s.kind == "comm"]
        bwd_end = max(s.end_s for s in step.spans if s.kind == "bwd")
        assert len(comm) >= 5
        assert sum(s.nbytes for s in comm) == 9231114 * 4
        assert any(s.start_s < bwd_end for s in comm)
    overlaps = [d.overlap for d in steps_of(events) if d.step > 0]
    assert max(overlaps) > 0
