"""`zero1`: ZeRO stage 1 (DeepSpeed's words: optimizer state partitioning), from torch, not re-implemented.

Gradients travel as under `ddp` (DistributedDataParallel, bucket_mb buckets, ring all-reduce 2(N−1)/N·S per rank);
the optimizer is torch.distributed.optim.ZeroRedundancyOptimizer around SGD: each rank keeps the momentum of its
share of the parameters only, steps that share, and broadcasts the updated share to the others. Its shares are whole
parameters (torch's partition), so they can be far from S/N: the broadcasts' bytes per rank come from the partition
torch made (wire.broadcast_shares; gloo: the owner of a share sends it to every other rank). The broadcasts are one
span, "zero1 parameter broadcast": ZeroRedundancyOptimizer.step runs the local optimizer's step, then broadcasts
every share and waits for them, so the span runs from the local optimizer's step-post hook to ZeRO's own (both
torch's public optimizer hooks). Nothing computes beside it (the step waits for the new parameters): `blocking`.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.optim import ZeroRedundancyOptimizer

from ddptop.metrics import wire
from ddptop.train.strategies.base import MOMENTUM, WEIGHT_DECAY, momentum_of
from ddptop.train.strategies.ddp import DDP


class Zero1(DDP):
    name = "zero1"
    owns_optimizer = True

    def build_optimizer(self, lr: float, momentum: dict[str, torch.Tensor]) -> torch.optim.Optimizer:
        """ZeroRedundancyOptimizer(SGD) over the trained parameters; each rank takes the momentum of its share."""
        params = [p for _, p in self.named_params]
        self.optimizer = zero = ZeroRedundancyOptimizer(params, optimizer_class=torch.optim.SGD, lr=lr,
                                                        momentum=MOMENTUM, weight_decay=WEIGHT_DECAY)
        names = {p: n for n, p in self.named_params}
        for group in zero.optim.param_groups:  # `optim`: the rank's local optimizer over its share
            for param in group["params"]:
                if names[param] in momentum:
                    zero.optim.state[param]["momentum_buffer"] = momentum[names[param]].clone()
        size = sum(p.numel() * p.element_size() for p in params)
        mine = sum(p.numel() * p.element_size() for group in zero.optim.param_groups for p in group["params"])
        shares = [mine] * self.world_size  # each rank's share as torch partitioned them: every rank says its own
        if self.world_size > 1:
            told = [torch.zeros(1, dtype=torch.int64, device=params[0].device) for _ in range(self.world_size)]
            dist.all_gather(told, torch.tensor([mine], dtype=torch.int64, device=params[0].device))
            shares = [int(t.item()) for t in told]
        sent, received = wire.broadcast_shares(shares, self.rank, dist.get_backend())
        comm = self.comm
        started = []

        def arrived(optimizer, args, kwargs):  # the local step is done: the broadcasts start now
            started[:] = [comm.arrive()] if self.world_size > 1 else []

        def broadcast(optimizer, args, kwargs):  # every share is broadcast and waited for
            if started:
                comm.add("zero1 parameter broadcast", started.pop(), comm.now(), size, sent, received, blocking=True)

        zero.optim.register_step_post_hook(arrived)
        zero.register_step_post_hook(broadcast)
        return zero

    def export_momentum(self) -> dict[str, torch.Tensor]:
        """Every parameter's momentum, whole, on every rank: each share's owner broadcasts it (one all_reduce first
        tells every rank who owns which and whether it has momentum yet)."""
        local = self.optimizer.optim
        owned = {p for group in local.param_groups for p in group["params"]}
        device = self.named_params[0][1].device
        owner = torch.zeros(2, len(self.named_params), dtype=torch.int64, device=device)
        for index, (_, param) in enumerate(self.named_params):
            if param in owned:
                owner[0, index] = self.rank
                owner[1, index] = int(momentum_of(local, param) is not None)
        if self.world_size > 1:
            dist.all_reduce(owner)
        out = {}
        for index, (name, param) in enumerate(self.named_params):
            if not owner[1, index]:
                continue
            source = int(owner[0, index])
            buffer = momentum_of(local, param) if source == self.rank else torch.empty_like(param)
            buffer = buffer.detach().clone()
            if self.world_size > 1:
                dist.broadcast(buffer, src=source)
            out[name] = buffer
        return out

    def teardown(self) -> None:
        super().teardown()
        self.optimizer = None
