"""ddptop.api's model wrapper: a switch replaces its `inner` (the plain model, or DDP around it) while the optimizer
keeps training the same tensors; and the API's misuse errors, each one line before anything starts."""

from __future__ import annotations

import sys

import pytest
import torch
import torch.distributed as dist
from torch import nn

from ddptop import api
from ddptop.config import RunConfig, SyncConfig
from ddptop.errors import UsageError
from ddptop.train.loop import build_for
from ddptop.train.worker import make_probe


@pytest.fixture
def one_rank():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_a_switch_swaps_the_inner_module_and_the_optimizer_trains_the_same_tensors(one_rank):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    held = [id(p) for group in optimizer.param_groups for p in group["params"]]
    wrapper = api.OwnModel(model)
    probe = make_probe(RunConfig(), 0, 1, torch.device("cpu"), [].append)
    x, y = torch.randn(16, 4), torch.randn(16, 1)
    strategy = None
    for name, inner_type in (("ddp", nn.parallel.DistributedDataParallel), ("allreduce", nn.Sequential),
                             ("ddp", nn.parallel.DistributedDataParallel)):
        if strategy is not None:
            strategy.teardown()
        strategy, wrapper.inner = build_for(model, SyncConfig(strategy=name), 0, 1, torch.device("cpu"), probe)
        assert type(wrapper.inner) is inner_type
        assert [id(p) for p in wrapper.parameters()] == held  # the same Parameter objects under every strategy
        assert list(wrapper.state_dict()) == list(model.state_dict())  # no `inner.` or DDP's `module.` prefix
        before = [p.detach().clone() for p in model.parameters()]
        assert torch.equal(wrapper(x), model(x))
        nn.functional.mse_loss(wrapper(x), y).backward()
        strategy.after_backward()
        strategy.before_step()
        optimizer.step()
        optimizer.zero_grad()
        assert all(not torch.equal(a, p) for a, p in zip(before, model.parameters())), name  # trained in place
    assert wrapper.module is model


def test_misuse_is_refused_before_anything_starts(monkeypatch):
    monkeypatch.setattr(api, "_joined", [])
    monkeypatch.setattr(sys, "excepthook", sys.excepthook)  # join installs its one-line hook
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "SLURM_PROCID"):
        monkeypatch.delenv(key, raising=False)
    with pytest.raises(UsageError, match="one rank of a job"):
        api.join()
    job = api.join(master="127.0.0.1", port=1, rank=0, world_size=1, no_record=True)
    with pytest.raises(UsageError, match="called twice"):
        api.join(master="127.0.0.1", port=1, rank=0, world_size=1, no_record=True)
    with pytest.raises(UsageError, match="before job.prepare"):
        job.step(batch_size=8)
    model = nn.Linear(2, 2)
    with pytest.raises(UsageError, match="not the model's parameters"):
        job.prepare(model, torch.optim.SGD(nn.Linear(2, 2).parameters(), lr=0.1))
    with pytest.raises(UsageError, match="takes an nn.Module"):
        job.prepare(model, "sgd")
    with pytest.raises(UsageError, match="strategy"):
        api._joined.clear() or api.join(master="127.0.0.1", port=1, rank=0, world_size=1, strategy="ring")
