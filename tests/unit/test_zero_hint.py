"""The ZeRO accumulation hint (issue 43, item 5): under zero2/zero3 accumulation saves little communication, since
FSDP2 all-gathers every unit again in each micro-step (cosmos-framework#161: 4 micro-steps took 430.6 s against
110.2 s a step); the hint names the bytes moved per step and per micro-step, and says nothing elsewhere."""

from __future__ import annotations

from ddptop.metrics.hints import Inputs, hints


def segment(strategy: str, accum: int, moved_by: str = "NIC") -> Inputs:
    # rank 1 moved most: 12 MB sent a step (what the hint must name, per step and per micro-step)
    return Inputs(strategy=strategy, bucket_mb=25.0, world_size=3, step_s=1.0, data_s=0.0, comm_s=0.1,
                  exposed_comm_s=0.1, moved={0: (9e6, 9e6), 1: (12e6, 10e6), 2: (9e6, 9e6)}, moved_by=moved_by,
                  accum=accum)


def test_accumulation_under_zero3_names_the_bytes_each_micro_step_moves():
    found = {h.name: h for h in hints(segment("zero3", 4))}
    hint = found["accumulation under ZeRO"]
    assert hint.numbers == {"accum": 4, "rank": 1, "step_bytes": 12e6, "micro_step_bytes": 3e6}
    assert hint.text.startswith("accum 4 under zero3 saves little communication: rank 1 sent 12 MB a step, 3 MB "
                                "each micro-step: every micro-step all-gathers each unit again")
    assert hint.source == "NIC counters per rank"
    assert "the wire formulas" in hints(segment("zero2", 2, "formula"))[-1].source


def test_no_accumulation_hint_without_accumulation_or_without_sharding():
    for strategy, accum in (("zero3", 1), ("zero2", 1), ("ddp", 4), ("zero1", 4), ("allreduce", 2)):
        assert "accumulation under ZeRO" not in {h.name for h in hints(segment(strategy, accum))}
