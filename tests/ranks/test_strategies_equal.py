"""Each strategy, after one step on real gloo ranks, leaves the parameters single-process training would."""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from ddptop.config import SyncConfig
from ddptop.control.store import free_port
from ddptop.probes.comm import CommRecorder
from ddptop.train.models import TinyCNN
from ddptop.train.strategies import build_strategy

WORLD = 2
PER_RANK = 4
# float32 sums in another order: differences are ~1e-7 relative; BatchNorm is left out of the model on purpose
# (its batch statistics are per rank in data parallel training, so no strategy can match a global batch with it).
TOLERANCE = 1e-5


def global_batch():
    g = torch.Generator().manual_seed(7)
    return torch.randn(WORLD * PER_RANK, 3, 32, 32, generator=g), torch.randint(0, 10, (WORLD * PER_RANK,), generator=g)


def one_step(model, forward, inputs, labels, strategy=None):
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    loss = torch.nn.functional.cross_entropy(forward(inputs), labels)
    loss.backward()
    if strategy is not None:
        strategy.after_backward()
        strategy.before_step()
    opt.step()
    return [p.detach().clone() for p in model.parameters()]


SYNCS = [
    SyncConfig(strategy="gather-scatter"),
    SyncConfig(strategy="allreduce"),
    SyncConfig(strategy="allreduce", async_op=True),
    SyncConfig(strategy="ddp", bucket_mb=0.01),  # several buckets
    SyncConfig(strategy="ddp", bucket_mb=25),
]


def _rank(rank, port, out_dir):
    """One process group, every strategy in turn from the same initial weights (one spawn keeps the test fast)."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
    inputs, labels = global_batch()
    part = slice(rank * PER_RANK, (rank + 1) * PER_RANK)
    for index, sync in enumerate(SYNCS):
        torch.manual_seed(0)
        model = TinyCNN(batch_norm=False)
        strategy = build_strategy(sync, rank, WORLD, CommRecorder())
        forward = strategy.prepare(model)
        params = one_step(model, forward, inputs[part], labels[part], strategy)
        strategy.teardown()
        torch.save(params, os.path.join(out_dir, f"sync{index}-rank{rank}.pt"))
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    out = tmp_path_factory.mktemp("equal")
    mp.spawn(_rank, args=(free_port(), str(out)), nprocs=WORLD, join=True)
    return out


def reference():
    torch.manual_seed(0)
    model = TinyCNN(batch_norm=False)
    inputs, labels = global_batch()
    return one_step(model, model, inputs, labels)


@pytest.mark.parametrize("index", range(len(SYNCS)), ids=[s.describe().replace(" ", "-") for s in SYNCS])
def test_one_step_equals_single_process_on_the_global_batch(index, results):
    expected = reference()
    for rank in range(WORLD):
        got = torch.load(results / f"sync{index}-rank{rank}.pt")
        for want, have in zip(expected, got):
            assert torch.allclose(want, have, atol=TOLERANCE, rtol=0), (rank, (want - have).abs().max())


def test_single_strategy_alone_is_plain_training():
    torch.manual_seed(0)
    model = TinyCNN(batch_norm=False)
    strategy = build_strategy(SyncConfig(strategy="single"), 0, 1, CommRecorder())
    forward = strategy.prepare(model)
    inputs, labels = global_batch()
    got = one_step(model, forward, inputs, labels, strategy)
    for want, have in zip(reference(), got):
        assert torch.equal(want, have)
