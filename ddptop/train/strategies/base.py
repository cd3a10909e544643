"""The one small interface every gradient-sync strategy implements."""

from __future__ import annotations

import contextlib

import torch
from torch import nn

from ddptop.config import SyncConfig
from ddptop.probes.comm import CommRecorder


WIRE_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
MOMENTUM, WEIGHT_DECAY = 0.9, 1e-4  # the loop's SGD, whoever builds it (the loop, or a zero strategy)


def plain_optimizer(model: nn.Module, lr: float, momentum: dict[str, torch.Tensor] | None = None) -> torch.optim.SGD:
    """The loop's SGD over the plain model, holding `momentum` (full tensors by parameter name) where given."""
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=MOMENTUM, weight_decay=WEIGHT_DECAY)
    for name, param in model.named_parameters():
        if momentum and name in momentum:
            optimizer.state[param]["momentum_buffer"] = momentum[name]
    return optimizer


def momentum_of(optimizer: torch.optim.Optimizer, param) -> torch.Tensor | None:
    """SGD's momentum buffer for `param` (None before its first step)."""
    return optimizer.state.get(param, {}).get("momentum_buffer")


def momentum_by_name(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, torch.Tensor]:
    """A plain optimizer's momentum, by the model's parameter names (what a zero strategy takes in)."""
    out = {}
    for name, param in model.named_parameters():
        buffer = momentum_of(optimizer, param)
        if buffer is not None:
            out[name] = buffer
    return out


class Strategy:
    """Makes every rank's gradients the global mean before the optimizer step.

    The loop calls, per configuration segment: `prepare` once (returns the module to run forward on),
    then per step `micro_step(last)` around each micro-step, `after_backward` (launch or run the collectives)
    and `before_step` (wait for async handles); `teardown` when the configuration changes.
    """

    name = "base"
    owns_optimizer = False  # zero1/2/3: the strategy builds the optimizer (build_optimizer, export_momentum)
    find_unused = False  # the model has parameters that get no gradient (train.specs.try_batch found them)

    def __init__(self, sync: SyncConfig, rank: int, world_size: int, comm: CommRecorder, device_ids=None):
        self.sync = sync
        self.rank = rank
        self.world_size = world_size
        self.comm = comm
        self.device_ids = device_ids

    def prepare(self, model: nn.Module) -> nn.Module:
        self.model = model
        self.named_params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        return model

    def grad(self, param):
        """The parameter's gradient; zeros for one that got none this step (its layer was not used), so that every
        rank runs the same collectives (a rank that skipped one would leave its peers waiting)."""
        if param.grad is None:
            param.grad = torch.zeros_like(param)
        return param.grad

    def micro_step(self, last: bool):
        """The context a micro-step's forward and backward run in (`last`: the one whose gradients are synced).
        Collectives that run after backward need nothing here: they run once, after the last."""
        return contextlib.nullcontext()

    def wire_dtype(self) -> torch.dtype | None:
        """The dtype gradients travel in under `compress` (fp16, bf16), or None: as they are."""
        return WIRE_DTYPES.get(self.sync.compress)

    def after_backward(self) -> None:
        pass

    def before_step(self) -> None:
        pass

    def trial_module(self) -> nn.Module:
        """The module a trial step (the first after the batch grew) runs forward on: one that starts no
        collective, so a rank that runs out of memory leaves no peer inside one."""
        return self.model

    def trial_sync(self) -> None:
        """Finish a trial step's gradients as the strategy does (every rank's backward is done by now)."""
        self.after_backward()
        self.before_step()

    def module(self) -> nn.Module:
        """The module whose layers really run forward (the probe watches it; evaluation runs it)."""
        return self.model

    def full_parameters(self):
        """(name, full tensor) of every parameter, in the plain model's order (the fingerprint's input)."""
        return self.model.named_parameters()

    def build_optimizer(self, lr: float, momentum: dict[str, torch.Tensor]) -> torch.optim.Optimizer:
        """A strategy that owns the optimizer builds it here, taking `momentum` (full tensors by name)."""
        raise NotImplementedError(f"{self.name} uses the loop's optimizer")

    def export_momentum(self) -> dict[str, torch.Tensor]:
        """The owned optimizer's momentum as full tensors by name, on every rank (a collective), before teardown."""
        raise NotImplementedError(f"{self.name} uses the loop's optimizer")

    def teardown(self) -> None:
        pass
