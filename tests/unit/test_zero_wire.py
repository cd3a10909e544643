"""The bytes ddptop counts for zero1's broadcasts rest on which rank owns which parameter: wire.zero1_owners must be
the partition torch's ZeroRedundancyOptimizer itself makes (read here from torch, in a process of its own with
torch's fake process group of N ranks, so no rank needs to run). The NICs' own counters check the bytes in the lab
(tests/lab/test_zero_lab.py)."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

from ddptop.metrics.wire import broadcast_shares, reduce_scatter, ring_all_gather, ring_allreduce, zero1_owners

TORCHS = """
import json, sys, traceback, torch, torch.distributed as dist
from torch.testing._internal.distributed.fake_pg import FakeStore
from torch.distributed.optim import ZeroRedundancyOptimizer
out = {}
for world, cases in json.loads(sys.argv[1]):
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)
    for name, shapes in cases:
        try:
            params = [torch.nn.Parameter(torch.zeros(*shape)) for shape in shapes]
            zero = ZeroRedundancyOptimizer(params, optimizer_class=torch.optim.SGD, lr=0.1)
            parts = zero._partition_parameters()
            out[f"{name} @ {world}"] = [next(r for r, groups in enumerate(parts) for g in groups
                                             for q in g["params"] if q is p) for p in params]
        except Exception:
            out[f"{name} @ {world}"] = traceback.format_exc()
    dist.destroy_process_group()
print(json.dumps(out))
"""
MODELS = {
    "wide mlp": [[512, 3072], [512], [512, 512], [512], [10, 512], [10]],
    "equal sizes": [[64, 64]] * 7 + [[64]] * 3,  # ties: the first of the equally light ranks
    "one huge": [[1000, 1000], [3], [5], [7], [11, 2]],
}
WORLDS = [2, 3, 4]


@pytest.fixture(scope="module")
def torchs_partitions() -> dict:
    """Every case's owners as torch partitions them ("MODEL @ WORLD": a list, or that case's traceback), from one
    process: one torch import, one fake process group per world size in turn."""
    cases = [[world, [[name, shapes] for name, shapes in MODELS.items()]] for world in WORLDS]
    run = subprocess.run([sys.executable, "-c", TORCHS, json.dumps(cases)], capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("model", sorted(MODELS))
def test_the_owners_are_the_partition_torch_makes(model, world, torchs_partitions):
    shapes = MODELS[model]
    torchs = torchs_partitions[f"{model} @ {world}"]
    assert isinstance(torchs, list), f"{model} on {world} ranks: torch's partition failed: {torchs}"
    numels = [math.prod(s) for s in shapes]
    assert zero1_owners(numels, world) == torchs, f"{model} on {world} ranks"


def test_a_gloo_share_goes_from_its_owner_to_every_other_rank():
    shares = [6_291_456, 1_048_576, 24_616]  # the wide MLP's shares on 3 ranks (owners above), float32 bytes
    total = sum(shares)
    assert broadcast_shares(shares, 0, "gloo") == (2 * 6_291_456, total - 6_291_456)
    assert broadcast_shares(shares, 2, "gloo") == (2 * 24_616, total - 24_616)
    assert broadcast_shares(shares, 0, "nccl") == (total - 1_048_576, total - 6_291_456)  # a ring: all but one
    assert broadcast_shares([5], 0, "gloo") == (0, 0)


def test_gloos_reduce_scatter_moves_an_all_reduce():
    assert reduce_scatter(9000, 3, "gloo") == ring_allreduce(9000, 3) == (12000, 12000)  # 2(N−1)/N·S
    assert reduce_scatter(9000, 3, "nccl") == ring_all_gather(9000, 3) == (6000, 6000)  # (N−1)/N·S
