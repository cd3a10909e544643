"""`ddp`: DistributedDataParallel with `bucket_mb` (bucket_cap_mb) (CS744 part 3).

Gradients are grouped into buckets of about bucket_mb and each bucket is all-reduced (ring: 2(N−1)/N·S
per rank) as soon as its gradients are ready, overlapping the rest of the backward pass. A comm hook wraps
the default all-reduce to stamp each bucket's launch and completion without changing what DDP sends.
DDP also broadcasts BatchNorm buffers from rank 0 at every forward (a few KB; not counted here).
"""

import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel

from ddptop.metrics import wire
from ddptop.probes.own import now
from ddptop.train.strategies.base import Strategy


class DDP(Strategy):
    name = "ddp"

    def prepare(self, model: nn.Module) -> nn.Module:
        super().prepare(model)
        # find_unused_parameters only where needed: it walks the autograd graph after every forward
        self.ddp = DistributedDataParallel(model, device_ids=self.device_ids, bucket_cap_mb=self.sync.bucket_mb,
                                           find_unused_parameters=self.find_unused)
        if self.comm.enabled:
            self.ddp.register_comm_hook(self, _timed_allreduce)
        return self.ddp

    def trial_module(self) -> nn.Module:
        # the plain model: DDP's reducer ignores its hooks when forward did not go through DDP (what no_sync()
        # does), and DDP's forward would also broadcast buffers, a collective a rank out of memory never reaches
        return self.model

    def trial_sync(self) -> None:
        """The mean gradient DDP's buckets would give, one all_reduce per parameter (the trial step only)."""
        n = self.world_size
        for name, param in self.named_params:
            grad = self.grad(param)
            size = grad.numel() * grad.element_size()
            start = self.comm.arrive()
            dist.all_reduce(grad, op=dist.ReduceOp.SUM)
            grad.div_(n)
            self.comm.add(f"allreduce {name}", start, self.comm.now(), size, *wire.ring_allreduce(size, n))

    def teardown(self) -> None:
        # dropping the wrapper releases its reducer; parameters stay with the plain model
        self.ddp = None


def _timed_allreduce(strategy: DDP, bucket):
    began = now()
    comm = strategy.comm
    buffer = bucket.buffer()
    size = buffer.numel() * buffer.element_size()
    index = bucket.index()
    comm.own.since(began)  # the hook's own Python runs on the training path: ddptop's cost, not DDP's
    start = comm.arrive()
    future = default_hooks.allreduce_hook(None, bucket)
    began = now()

    def stamp(fut):
        comm.add(f"bucket {index}", start, comm.now(), size, *wire.ring_allreduce(size, strategy.world_size))
        return fut.value()

    chained = future.then(stamp)
    comm.own.since(began)
    return chained
