"""The trial step (the first after the batch grew: train.loop's _trial_step) under fp16 compression, on real gloo
ranks: every strategy's trial_sync divides by the world size before the 2-byte all-reduce, as torch's
fp16_compress_hook does, so gradients whose sum over the ranks passes fp16's largest value (65504) while their
mean does not come back finite and equal to the mean."""

from __future__ import annotations

import math
import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from ddptop.config import SyncConfig
from ddptop.probes.comm import CommRecorder
from ddptop.train.strategies import build_strategy

import ports

WORLD = 2
FP16_MAX = 65504.0
# each rank's gradient: exact in fp16 (a multiple of its spacing there, 32 above 32768 and 16 below), as are their
# halves; the sum (80000) is past fp16's largest value, the mean (40000) is not
RANK_GRADS = (60000.0, 20000.0)
MEAN = sum(RANK_GRADS) / WORLD
SYNCS = [SyncConfig(strategy="ddp", compress="fp16"), SyncConfig(strategy="allreduce", compress="fp16"),
         SyncConfig(strategy="allreduce", async_op=True, compress="fp16"),
         SyncConfig(strategy="gather-scatter", compress="fp16")]


def _rank(rank, port, out_dir):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
    for index, sync in enumerate(SYNCS):
        model = torch.nn.Linear(1, 1, bias=False)
        strategy = build_strategy(sync, rank, WORLD, CommRecorder())
        strategy.prepare(model)
        # a trial step as the loop runs it: forward on the trial module (no collective), backward, trial_sync
        strategy.trial_module()(torch.tensor([[RANK_GRADS[rank]]])).sum().backward()
        assert model.weight.grad.item() == RANK_GRADS[rank]
        strategy.trial_sync()
        torch.save(model.weight.grad.clone(), os.path.join(out_dir, f"sync{index}-rank{rank}.pt"))
        strategy.teardown()
    dist.barrier()  # as test_strategies_equal: no rank leaves while a peer is inside a collective
    os._exit(0)


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    out = tmp_path_factory.mktemp("trial")
    mp.spawn(_rank, args=(ports.port(), str(out)), nprocs=WORLD, join=True)
    return out


@pytest.mark.parametrize("index", range(len(SYNCS)), ids=[s.describe().replace(" ", "-") for s in SYNCS])
def test_a_trial_steps_fp16_gradients_are_divided_before_the_all_reduce(index, results):
    assert sum(RANK_GRADS) > FP16_MAX > MEAN
    for rank in range(WORLD):
        grad = torch.load(results / f"sync{index}-rank{rank}.pt")
        assert math.isfinite(grad.item()) and grad.item() == MEAN, (SYNCS[index].describe(), rank, grad.item())
