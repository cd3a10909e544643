"""`ddp`: DistributedDataParallel with `bucket_mb` (bucket_cap_mb) (CS744 part 3).

Gradients are grouped into buckets of about bucket_mb and each bucket is all-reduced (ring: 2(N−1)/N·S
per rank) as soon as its gradients are ready, overlapping the rest of the backward pass. A comm hook wraps
torch's hook for `compress` to stamp each bucket's launch and completion without changing what DDP sends:
none: default allreduce (S); fp16/bf16: fp16_compress_hook / bf16_compress_hook (S/2); powersgd:R: powerSGD_hook
(rank-R factors P and Q per matrix plus the uncompressed tensors, wire.powersgd_allreduce), after its own warm-up
of POWERSGD_START_STEP plain all-reduce steps. PowerSGD's error feedback is per rank and starts empty at every
segment (a switch). With accum K, the first K−1 micro-steps run under no_sync(): no hook, no bytes.
DDP also broadcasts BatchNorm buffers from rank 0 at every forward (a few KB; not counted here).
"""

import contextlib

import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
from torch.nn.parallel import DistributedDataParallel

from ddptop.metrics import wire
from ddptop.probes.own import now
from ddptop.train.strategies.base import Strategy

# torch's default is 1000 (its guide: ~10% of a run); 10 keeps PowerSGD visible in a short run while skipping
# DDP's bucket rebuild after step 1, before which torch refuses to start PowerSGD (start_powerSGD_iter > 1)
POWERSGD_START_STEP = 10
HOOKS = {"none": default_hooks.allreduce_hook, "fp16": default_hooks.fp16_compress_hook,
         "bf16": default_hooks.bf16_compress_hook}


class DDP(Strategy):
    name = "ddp"

    def prepare(self, model: nn.Module) -> nn.Module:
        super().prepare(model)
        # find_unused_parameters only where needed: it walks the autograd graph after every forward
        self.ddp = DistributedDataParallel(model, device_ids=self.device_ids, bucket_cap_mb=self.sync.bucket_mb,
                                           find_unused_parameters=self.find_unused)
        self.powersgd, self._previous = None, None
        if self.sync.powersgd_rank:  # a new state per segment: the error feedback restarts at every switch
            self.powersgd = powerSGD_hook.PowerSGDState(
                process_group=None, matrix_approximation_rank=self.sync.powersgd_rank,
                start_powerSGD_iter=POWERSGD_START_STEP, min_compression_rate=wire.POWERSGD_MIN_RATE)
        if self.comm.enabled:
            self.ddp.register_comm_hook(self, _timed_hook)
        elif self.powersgd is not None:
            self.ddp.register_comm_hook(self, lambda strategy, bucket: strategy.hook(bucket)[0])
        elif self.sync.compress != "none":
            self.ddp.register_comm_hook(None, HOOKS[self.sync.compress])
        return self.ddp

    def micro_step(self, last: bool):
        # all but the last micro-step accumulate locally: DDP's reducer launches no bucket under no_sync()
        return contextlib.nullcontext() if last else self.ddp.no_sync()

    def trial_module(self) -> nn.Module:
        # the plain model: DDP's reducer ignores its hooks when forward did not go through DDP (what no_sync()
        # does), and DDP's forward would also broadcast buffers, a collective a rank out of memory never reaches
        return self.model

    def trial_sync(self) -> None:
        """The mean gradient DDP's buckets would give, one all_reduce per parameter (the trial step only;
        fp16/bf16 cast and divided by N before the sum as the hook does, so the sum cannot pass fp16's 65504 where
        the mean does not; PowerSGD sends this one step whole)."""
        n, dtype = self.world_size, self.wire_dtype()
        for name, param in self.named_params:
            grad = self.grad(param)
            sent = grad if dtype is None else grad.to(dtype).div_(n)
            size = sent.numel() * sent.element_size()
            start = self.comm.arrive()
            dist.all_reduce(sent, op=dist.ReduceOp.SUM)
            if sent is grad:
                grad.div_(n)
            else:
                grad.copy_(sent)
            self.comm.add(f"allreduce {name}", start, self.comm.now(), size, *wire.ring_allreduce(size, n))

    def hook(self, bucket):
        """torch's hook for `compress`, and (tensor bytes, sent, received) per rank for this bucket."""
        buffer = bucket.buffer()
        size = buffer.numel() * buffer.element_size()
        state = self.powersgd
        if state is None:
            size = wire.compressed(size, self.sync.compress)
            return HOOKS[self.sync.compress](None, bucket), (size, *wire.ring_allreduce(size, self.world_size))
        if state.iter < state.start_powerSGD_iter:  # PowerSGD's warm-up: the hook all-reduces the whole bucket
            return powerSGD_hook.powerSGD_hook(state, bucket), (size, *wire.ring_allreduce(size, self.world_size))
        shapes = [tuple(g.shape) for g in bucket.gradients()]
        counted = wire.powersgd_allreduce(shapes, self.sync.powersgd_rank, self.world_size, buffer.element_size())
        if self._previous is not None:
            # PowerSGD starts a bucket's P and Q all-reduces from callbacks in gloo's threads: with two buckets in
            # flight the ranks issued them in different orders (gloo: "960 vs 192 bytes ... collective mismatch",
            # rank 0 aborted). One bucket at a time keeps every rank's order the same
            self._previous.wait()
        self._previous = future = powerSGD_hook.powerSGD_hook(state, bucket)
        return future, counted

    def teardown(self) -> None:
        # dropping the wrapper releases its reducer; parameters stay with the plain model
        self.ddp = None
        self.powersgd = None


def _timed_hook(strategy: DDP, bucket):
    began = now()
    comm = strategy.comm
    index = bucket.index()
    comm.own.since(began)  # the hook's own Python runs on the training path: ddptop's cost, not DDP's
    start = comm.arrive()
    future, (size, sent, received) = strategy.hook(bucket)
    began = now()

    def stamp(fut):
        comm.add(f"bucket {index}", start, comm.now(), size, sent, received)
        return fut.value()

    chained = future.then(stamp)
    comm.own.since(began)
    return chained
