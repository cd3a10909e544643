"""What-if rows for ZeRO-1/2/3 (issue 43, item 5): step time and memory per rank, at this world size and others,
against answers worked by hand from a known link (α, β) and the strategies' collectives as torch runs them
(tests/ranks/test_zero_timing.py: on a CPU every one of them is exposed)."""

from __future__ import annotations

import pytest

from ddptop.metrics.memory import held_by_formula
from ddptop.metrics.whatif import model as whatif
from ddptop.metrics.whatif.data import CommSample, LayerTime, SegmentData
from ddptop.metrics.whatif.rows import prediction_rows

ALPHA, BETA, WORLD = 0.5e-3, 8e-9, 2  # 0.5 ms a latency step, 1 Gbit/s
LAYERS = (("a.0", 100_000), ("a.2", 100_000), ("b", 50_000))  # two top-level blocks: units of 800 kB and 200 kB
P = 4 * sum(count for _, count in LAYERS)


def segment(backend: str = "gloo") -> SegmentData:
    """A DDP segment whose buckets took exactly α·2(N−1) + β·2(N−1)/N·S (four sizes: the fit recovers α and β)."""
    ring = tuple(CommSample("allreduce", n, ALPHA * 2 * (WORLD - 1) + BETA * 2 * (WORLD - 1) / WORLD * n)
                 for n in (10_000, 100_000, 400_000, 1_000_000))
    backward = ((LayerTime("b", 0.010), LayerTime("a.2", 0.020), LayerTime("a.0", 0.020)),)
    return SegmentData(segment=0, config={"strategy": "ddp", "bucket_mb": 25.0, "batch_size": 16}, world_size=WORLD,
                       layers=LAYERS, param_bytes=P, param_tensors=3, step_s=0.2, fwd_s=0.03, bwd_s=0.05,
                       opt_s=0.01, backward=backward, comm=ring, backend=backend)


def gather(nbytes: float, world: int) -> float:
    return ALPHA * (world - 1) + BETA * (world - 1) / world * nbytes


def allreduce(nbytes: float, world: int) -> float:
    return ALPHA * 2 * (world - 1) + BETA * 2 * (world - 1) / world * nbytes


@pytest.mark.parametrize("world", [2, 4, 8])
def test_zero2_and_zero3_expose_every_units_gathers_and_reduce_scatter(world):
    seg = segment()
    fitted = whatif.fit(seg)
    units = (800_000, 200_000)
    for strategy, gathers in (("zero2", 1), ("zero3", 2)):
        p = whatif.predict(fitted, whatif.Config(strategy, world_size=world))
        # gloo runs each unit's reduce-scatter as an all-reduce
        want = sum(gathers * gather(u, world) + allreduce(u, world) for u in units)
        assert p.comm_s == pytest.approx(want, rel=1e-6) and p.exposed_comm_s == pytest.approx(want, rel=1e-6)
        assert p.overlap == 0.0
    zero2, zero3 = (whatif.predict(fitted, whatif.Config(s, world_size=world)) for s in ("zero2", "zero3"))
    # zero3 gathers each unit again in backward: one more all-gather per unit, nothing else
    assert zero3.step_s - zero2.step_s == pytest.approx(sum(gather(u, world) for u in units), rel=1e-6)


def test_nccl_reduce_scatters_half_of_what_gloo_all_reduces():
    gloo, nccl = whatif.fit(segment("gloo")), whatif.fit(segment("nccl"))
    g, n = (whatif.predict(m, whatif.Config("zero2", world_size=4)) for m in (gloo, nccl))
    assert g.comm_s - n.comm_s == pytest.approx(sum(allreduce(u, 4) - gather(u, 4) for u in (800_000, 200_000)))


def test_zero1_is_ddp_then_the_shares_broadcast_after_the_step():
    fitted = whatif.fit(segment())
    for world in (2, 4):
        ddp = whatif.predict(fitted, whatif.Config("ddp", 25.0, world_size=world))
        zero1 = whatif.predict(fitted, whatif.Config("zero1", world_size=world))
        assert zero1.step_s - ddp.step_s == pytest.approx(gather(P, world), rel=1e-6)
        assert zero1.exposed_comm_s - ddp.exposed_comm_s == pytest.approx(gather(P, world), rel=1e-6)


def test_memory_per_rank_by_the_stages_formulas():
    # SGD with momentum: P, G = P, O = P on every rank of a replicated strategy
    assert held_by_formula("ddp", 1200, 3) == (1200, 1200, 1200)
    assert held_by_formula("zero1", 1200, 3) == (1200, 1200, 400)
    assert held_by_formula("zero2", 1200, 3) == held_by_formula("zero3", 1200, 3) == (400, 400, 400)
    assert held_by_formula("zero3", 1200, 3, momentum=False) == (400, 400, 0)
    # the drop from DDP to ZeRO-3: (1 − 1/N)(P + G + O)
    assert sum(held_by_formula("ddp", 1200, 3)) - sum(held_by_formula("zero3", 1200, 3)) == 2 / 3 * 3600


def test_the_table_has_a_row_for_each_stage_at_each_world_size_with_its_memory():
    rows = prediction_rows(segment(), [], worlds=(2, 4))
    by = {(r["strategy"], r["world_size"]): r for r in rows if r["strategy"].startswith("zero") or
          (r["strategy"] == "ddp" and r["bucket_mb"] == 25.0)}
    assert set(by) == {(s, w) for s in ("ddp", "zero1", "zero2", "zero3") for w in (2, 4)}
    for world in (2, 4):
        assert by[("ddp", world)]["held_bytes"] == 3 * P
        assert by[("zero1", world)]["held_bytes"] == 2 * P + P // world
        assert by[("zero3", world)]["held_bytes"] == by[("zero2", world)]["held_bytes"] == 3 * P // world
