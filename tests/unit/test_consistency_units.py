"""Pure pieces of issue 11/12: the fingerprint check's rules, meaningless settings refused, metrics arithmetic."""

from __future__ import annotations

import math

import pytest

from ddptop import metrics
from ddptop.config import SyncConfig
from ddptop.control.commands import apply_changes
from ddptop.errors import UsageError
from ddptop.events import ConfigApplied, ModelsDiverged, RunFinished, StepDone
from ddptop.front.fingerprints import FingerprintCheck


def applied(rank, segment, strategy, fp, step=0):
    return ConfigApplied(rank, step, segment, {"strategy": strategy}, 0, "test", 0.0, fingerprint=fp)


def test_fingerprints_must_agree_at_every_start_but_single_after_single_and_at_the_end_unless_single():
    check = FingerprintCheck(2)
    assert check.check([applied(0, 0, "ddp", "a"), applied(1, 0, "ddp", "a")]) == []
    out = check.check([applied(0, 1, "allreduce", "a", 5), applied(1, 1, "allreduce", "b", 5)])
    assert len(out) == 1 and isinstance(out[0], ModelsDiverged) and out[0].where == "segment start"
    assert "ranks 0: a" in out[0].describe() and "ranks 1: b" in out[0].describe()
    assert check.check([applied(0, 2, "single", "c"), applied(1, 2, "single", "c")]) == []
    assert check.check([applied(0, 3, "single", "c"), applied(1, 3, "single", "d")]) == []  # single after single
    assert check.check([RunFinished(0, 9, "done", 0.0, "x"), RunFinished(1, 9, "done", 0.0, "y")]) == []
    check = FingerprintCheck(2)
    check.check([applied(0, 0, "ddp", "a"), applied(1, 0, "ddp", "a")])
    out = check.check([RunFinished(0, 9, "done", 0.0, "x"), RunFinished(1, 9, "done", 0.0, "y")])
    assert [e.where for e in out] == ["end of run"]
    assert check.check([RunFinished(0, 9, "done", 0.0, "x")]) == []  # reported once


def test_settings_that_mean_nothing_for_the_strategy_are_refused():
    ddp = SyncConfig(strategy="ddp")
    with pytest.raises(UsageError, match="async_op applies only to allreduce"):
        apply_changes(ddp, {"async_op": True})
    with pytest.raises(UsageError, match="bucket_mb applies only to ddp"):
        apply_changes(SyncConfig(strategy="allreduce"), {"bucket_mb": 10.0})
    with pytest.raises(UsageError, match="async_op"):
        SyncConfig(strategy="ddp", async_op=True)
    left = apply_changes(SyncConfig(strategy="allreduce", async_op=True), {"strategy": "ddp"})
    assert left.async_op is False and left.describe() == "ddp bucket=25MB batch=64"
    assert apply_changes(ddp, {"strategy": "allreduce", "async_op": True}).describe() == "allreduce async batch=64"
    assert "bucket" not in apply_changes(ddp, {"strategy": "single"}).describe()


def step(rank, n, iter_s, batch=8, segment=0, sampled=False, **kw):
    base = dict(data_s=0.01, compute_s=0.05, comm_s=0.04, exposed_comm_s=0.02, overlap=0.5, fwd_s=0.02,
                bwd_s=0.02, opt_s=0.01, own_s=0.001)
    base.update(kw)
    return StepDone(rank, n, 0, segment, 0.0, iter_s, base["data_s"], base["compute_s"], base["comm_s"],
                    base["exposed_comm_s"], base["overlap"], batch, 1.0 + n, 0, 100, 100, sampled,
                    base["fwd_s"], base["bwd_s"], base["opt_s"], base["own_s"])


def test_parts_add_up_to_the_step_and_windows_use_totals_not_means_of_rates():
    d = step(0, 1, 0.1)
    # each part is the field it names (not `other` absorbing whatever is left, which makes any sum add up)
    assert metrics.parts(d) == pytest.approx({"data": 0.01, "forward": 0.02, "backward": 0.02, "exposed comm": 0.02,
                                              "optimizer": 0.01, "ddptop": 0.001, "other": 0.019})
    fig = metrics.window([step(0, 1, 0.1), step(0, 2, 0.3), step(0, 3, 9.0, sampled=True)])
    assert fig.steps == 2 and fig.step_s == pytest.approx(0.2)
    assert fig.images_per_s == pytest.approx(16 / 0.4)  # not (80 + 26.7) / 2: images over time
    assert fig.loss == 4.0  # the window's last step, sampled or not


def test_segment_table_leaves_out_warmup_and_sampled_steps_and_names_the_slowest_rank():
    events = [ConfigApplied(r, 0, 0, {"strategy": "ddp"}, 0, "start", 0.0) for r in (0, 1)]
    events += [step(0, n, 0.1, sampled=n == 3) for n in range(5)] + [step(1, n, 0.2) for n in range(5)]
    (seg,) = metrics.SegmentTable.of(events, warmup=2).segments()
    assert seg.slowest_rank == 1 and seg.slowest.steps == 3 and seg.ranks[0].steps == 2
    assert seg.sampled_left_out == 1 and seg.slowest.step_s == pytest.approx(0.2)
    assert seg.mean.step_s == pytest.approx(0.15)
    assert seg.images_per_s == pytest.approx((2 * 8 + 3 * 8) / 0.6)
    assert seg.final_loss == pytest.approx(5.0) and not math.isnan(seg.final_loss)


def test_every_glossary_term_is_in_the_documentations_glossary():
    from pathlib import Path

    glossary = (Path(__file__).resolve().parents[2] / "docs" / "reference" / "glossary.md").read_text().lower()
    assert all(term.lower() in glossary for term in metrics.GLOSSARY), [t for t in metrics.GLOSSARY
                                                                    if t.lower() not in glossary]
