"""The zero strategies' settings (issue 43): what each means for SyncConfig, ctl, the screen's form and profiles;
the sharding units fully_shard gets; the wire formulas per step, each checked against numbers worked out by hand."""

from __future__ import annotations

from pathlib import Path

import pytest
from torch import nn

from ddptop.cli.run import config_from_args, parse_run_args
from ddptop.config import SyncConfig
from ddptop.control.commands import apply_changes, parse_assignments
from ddptop.errors import UsageError
from ddptop.events import RunStarted
from ddptop.metrics.expected import expected_bytes
from ddptop.train.strategies import REGISTRY
from ddptop.train.strategies.fsdp import shard_units
from ddptop.tui.widgets.controls import parse_form

PROFILE = Path(__file__).resolve().parents[2] / "ddptop" / "own_profiles" / "zero-stages.toml"


def test_every_zero_strategy_is_registered_and_owns_its_optimizer():
    assert {name: REGISTRY[name].owns_optimizer for name in ("ddp", "zero1", "zero2", "zero3")} == {
        "ddp": False, "zero1": True, "zero2": True, "zero3": True}
    assert (REGISTRY["zero2"].reshard, REGISTRY["zero3"].reshard) == (False, True)  # reshard_after_forward


def test_settings_mean_what_they_mean_for_each_zero_strategy():
    ddp = SyncConfig(strategy="ddp", compress="fp16")
    left = apply_changes(ddp, {"strategy": "zero3"})
    assert left.compress == "none" and left.describe() == "zero3 batch=64"  # fp16 cannot travel with FSDP2
    assert apply_changes(ddp, {"strategy": "zero1", "bucket_mb": 5.0}).describe() == "zero1 bucket=5MB batch=64"
    assert apply_changes(ddp, {"strategy": "zero2", "shard_unit": "Linear"}).describe() == "zero2 unit=Linear batch=64"
    with pytest.raises(UsageError, match="shard_unit applies only to zero2 and zero3, not to zero1"):
        apply_changes(ddp, {"strategy": "zero1", "shard_unit": "Linear"})
    with pytest.raises(UsageError, match="bucket_mb applies only to ddp and zero1, not to zero3"):
        apply_changes(ddp, {"strategy": "zero3", "bucket_mb": 5.0})
    with pytest.raises(UsageError, match="not to zero2"):
        SyncConfig(strategy="zero2", compress="bf16")
    for bad in ("a b", "Linear,", ",", "1abc", "x" * 10 + ",y" * 70):
        with pytest.raises(UsageError, match="shard_unit must be"):
            SyncConfig(strategy="zero3", shard_unit=bad)
    assert parse_assignments(["strategy=zero3", "shard_unit=features.0,Linear"]) == {
        "strategy": "zero3", "shard_unit": "features.0,Linear"}


def test_the_screens_form_switches_to_each_zero_strategy():
    current = SyncConfig(strategy="ddp").to_dict()
    for name in ("zero1", "zero2", "zero3"):
        changes, config = parse_form(name, "25", False, "64", current, compress="none")
        assert changes == {"strategy": name} and config.strategy == name


def test_a_profile_sweeps_the_zero_stages():
    args, profile = parse_run_args(["--profile", str(PROFILE)])
    cfg = config_from_args(args, profile)
    assert [s.strategy for s in cfg.sweep] == ["ddp", "zero1", "zero2", "zero3"]


class Blocks(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Linear(4, 4)
        self.act = nn.ReLU()  # no parameters: no unit
        self.body = nn.Sequential(nn.Linear(4, 4), nn.Sequential(nn.Linear(4, 4)))
        self.head = nn.Linear(4, 2)


def test_the_units_are_the_top_level_blocks_unless_named():
    model = Blocks()
    assert shard_units(model, "") == ["stem", "body", "head"]
    # every Linear, deepest first (fully_shard shards a unit inside another before it); the root is never listed
    assert shard_units(model, "Linear") == ["body.1.0", "body.0", "stem", "head"]
    assert shard_units(model, "body.1,head,Blocks") == ["body.1", "head"]
    with pytest.raises(UsageError, match=r"shard unit 'tail' names no module of this model \(top-level blocks: "
                                         r"stem, act, body, head; classes: Blocks, Linear, ReLU, Sequential\)"):
        shard_units(model, "head,tail")


def _run(world: int, param_bytes: int) -> RunStarted:
    return RunStarted("tiny", "synthetic", world, "ddp", 25.0, False, 16, 0.1, 250, param_bytes, 4, (), 20, 999.0)


@pytest.mark.parametrize("strategy,accum,expected", [
    ("ddp", 1, 1500),  # 2·3/4·1000
    ("zero1", 1, 2250),  # all-reduce 1500 + broadcasts 3/4·1000
    ("zero2", 1, 1500),  # all-gather 750 + reduce-scatter 750
    ("zero3", 1, 2250),  # all-gather twice + reduce-scatter
    ("zero2", 4, 3750),  # an all-gather in each of 4 micro-steps, one reduce-scatter
    ("zero3", 4, 6750),  # 8 all-gathers, one reduce-scatter
    ("zero1", 4, 2250),  # DDP's no_sync: one all-reduce and one broadcast per optimizer step
])
def test_expected_bytes_of_the_zero_stages(strategy, accum, expected):
    assert expected_bytes(_run(4, 1000), {"strategy": strategy, "accum": accum}, 1) == (expected, expected)


def test_gloo_on_cuda_takes_zero1_and_refuses_fsdp2_untried():
    from ddptop.train import devices

    devices.check_strategy("cuda", "gloo", "zero1")  # DDP's all-reduce and broadcasts: gloo moves CUDA tensors
    devices.check_strategy("cuda", "nccl", "zero3")
    for name in ("zero2", "zero3"):
        with pytest.raises(UsageError, match=f"{name} needs FSDP2's all-gather and reduce-scatter, not tried"):
            devices.check_strategy("cuda", "gloo", name)
