"""With gradient accumulation (accum K) the K−1 unsynchronized micro-steps are a part of the step of their own
(StepDone.micro_s), carved out of the forward pass: against the test's own sleeps in each micro-step (the step probe
on the CPU clock), and as the report's breakdown figure and segment table draw it. A real 2-rank job read by SQL:
tests/ranks/test_micro_steps_truth.py."""

from __future__ import annotations

import dataclasses
import time

import pytest
import torch

from ddptop import metrics
from ddptop.config import SyncConfig
from ddptop.events import StepDone
from ddptop.probes.clock import CpuClock
from ddptop.probes.step import StepProbe
from ddptop.report import figures, markdown
from ddptop.report.analysis import SegmentStats

K = 3
SLEEP_S = 0.010  # each micro-step's forward, backward and loading of the next batch
TEST_S = 0.030  # an epoch's test pass while a micro-step loads its batch: set aside, no step's time


class Watch:
    """The test's own clock around the probe's marks: each sleep as it really lasted (a loaded machine overshoots),
    and instants just before and just after a mark, so every bound below is what happened, with no slack."""

    def __init__(self) -> None:
        self.slept: dict[str, float] = {}
        self.at: dict[str, float] = {}

    def sleep(self, part: str, seconds: float) -> None:
        start = time.perf_counter()
        time.sleep(seconds)
        self.slept[part] = self.slept.get(part, 0.0) + time.perf_counter() - start

    def around(self, name: str, mark) -> None:
        self.at[f"before {name}"] = time.perf_counter()
        mark()
        self.at[f"after {name}"] = time.perf_counter()


def run_step(probe: StepProbe, step: int, accum: int, watch: Watch) -> None:
    """One step as train.loop._micro_steps marks it, every phase a sleep the watch times."""
    probe.begin()
    probe.ready(step, 0, 0)
    watch.sleep("data", SLEEP_S)
    watch.around("data", lambda: probe.mark("data"))
    for index in range(accum - 1):  # the unsynchronized micro-steps: forward, backward, the next batch
        watch.sleep("micro", SLEEP_S)
        probe.micro("fwd")
        watch.sleep("micro", SLEEP_S)
        probe.micro("bwd")
        watch.sleep("micro", SLEEP_S)
        if index == 0:
            probe.aside(TEST_S)
            watch.sleep("aside", TEST_S)
        watch.around("micro", lambda: probe.micro("data", index == accum - 2))
    watch.sleep("fwd", SLEEP_S)
    watch.around("fwd", lambda: probe.mark("fwd"))
    watch.sleep("bwd", SLEEP_S)
    probe.mark("bwd")
    probe.mark("sync")
    watch.sleep("opt", SLEEP_S)
    probe.mark("opt")
    probe.finish(torch.tensor(0.5), epoch=0, batch_size=16 * accum)


def resolved(accum: int) -> tuple[StepDone, Watch]:
    records: list = []
    probe = StepProbe(0, CpuClock(), records.append, spans=False)
    watch = Watch()
    run_step(probe, 0, accum, watch)
    probe.close()
    return next(e for r in records for e in r.resolve() if isinstance(e, StepDone)), watch


def test_the_unsynchronized_micro_steps_are_their_own_part_taken_out_of_forward():
    d, w = resolved(K)
    # the K−1 micro-steps' sleeps, as long as they really were; the test pass inside one is set aside (TEST_S, what
    # the loop declares), not theirs: at least the sleeps (plus the aside's overshoot), at most the time between
    # the marks that bound them
    assert w.slept["micro"] + w.slept["aside"] - TEST_S <= d.micro_s + 1e-9, (d, w.slept)
    assert d.micro_s <= w.at["after micro"] - w.at["before data"] - TEST_S, (d, w.at)
    assert (K - 1) * 3 * SLEEP_S <= d.micro_s  # never less than the sleeps asked for
    # the synchronized micro-step's forward only
    assert w.slept["fwd"] <= d.fwd_s + 1e-9 and d.fwd_s <= w.at["after fwd"] - w.at["before micro"], (d, w)
    assert d.compute_s == pytest.approx(d.micro_s + d.fwd_s + d.bwd_s + d.opt_s)
    assert d.aside_s == pytest.approx(TEST_S)
    parts = metrics.parts(d)
    assert list(parts)[:3] == ["data", metrics.MICRO, "forward"] and parts[metrics.MICRO] == d.micro_s
    measured = d.data_s + d.micro_s + d.fwd_s + d.bwd_s + d.opt_s + d.exposed_comm_s + d.own_s
    assert measured <= d.iter_s + 2e-5, (measured, d.iter_s)
    assert sum(parts.values()) == pytest.approx(d.iter_s)


def test_without_accumulation_there_is_no_micro_step_part():
    d, w = resolved(1)
    assert d.micro_s == 0 and metrics.MICRO not in metrics.parts(d)
    assert w.slept["fwd"] <= d.fwd_s + 1e-9 and d.fwd_s <= w.at["after fwd"] - w.at["before data"], (d, w)


def segment(index: int, accum: int, micro_s: float) -> SegmentStats:
    parts = dict.fromkeys(("data", "forward", "backward", "optimizer", "other"), 0.01)
    parts[metrics.MICRO] = micro_s
    return SegmentStats(label="", index=index, config=SyncConfig(strategy="ddp", accum=accum), world_size=2,
                        first_step=0, measured_steps=10, mean_step_s=sum(parts.values()),
                        median_step_s=sum(parts.values()), images_per_s=100.0, compute_s=0.04 + micro_s,
                        comm_s=0.01, exposed_comm_s=0.0, overlap=1.0, sent_mb_per_step=0.1, recv_mb_per_step=0.1,
                        nic_sent_mb_per_step=None, nic_recv_mb_per_step=None, cpu_percent=None, rss_mb=None,
                        final_loss=1.0, allreduce_gbps=None, mean_rank_step_s=sum(parts.values()), parts=parts,
                        micro_s=micro_s)


def test_the_breakdown_figure_and_table_show_the_micro_steps_of_an_accumulating_segment(tmp_path):
    stats = [segment(0, 1, 0.0), segment(1, 4, 0.09)]  # 3 micro-steps of 30 ms: 0.09 s of a 0.14 s step
    drawn = figures.breakdown(stats, ["accum 1", "accum 4"], tmp_path, "test").data
    shares = {b["label"]: b["height"] for b in drawn["axes"][0]["bars"]}
    assert shares[metrics.MICRO] == pytest.approx([0.0, 100 * 0.09 / 0.14])
    assert metrics.MICRO in drawn["axes"][0]["legend"]
    column = markdown.COLUMNS.index("K−1 micro-steps s")
    assert [markdown.row(s)[column] for s in stats] == ["0.0000", "0.0900"]
    plain = figures.breakdown(stats[:1], ["accum 1"], tmp_path, "test").data  # no segment accumulates: no part
    assert metrics.MICRO not in plain["axes"][0]["legend"]


def test_a_step_from_before_micro_s_reads_0_and_keeps_its_forward():
    fields = {f.name for f in dataclasses.fields(StepDone)}
    d = StepDone(0, 1, 0, 0, 1.0, 0.3, 0.0, 0.2, 0.0, 0.0, 0.0, 16, 1.0, 0, 0, 0, False, fwd_s=0.1, bwd_s=0.1)
    assert "micro_s" in fields and d.micro_s == 0 and metrics.parts(d)["forward"] == 0.1
