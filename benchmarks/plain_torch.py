"""The baseline: a plain torch.distributed script doing exactly what a ddptop step does, with no ddptop in the loop.

Same model class, same data, same DataLoader + DistributedSampler, same optimizer, same threads per rank;
gradient sync written the way the CS744 assignments write it.
"""

from __future__ import annotations

import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from ddptop.config import RunConfig, SyncConfig  # noqa: E402  (data and model definitions only)
from ddptop.train import lifetime  # noqa: E402
from ddptop.train.data import build_datasets, make_loader  # noqa: E402
from ddptop.train.models import build_model  # noqa: E402


def sync_gradients(model, strategy, rank, world, async_op):
    params = [p for p in model.parameters() if p.grad is not None]
    if strategy == "allreduce":
        handles = [dist.all_reduce(p.grad, op=dist.ReduceOp.SUM, async_op=async_op) for p in params]
        for p, h in zip(params, handles):
            if async_op:
                h.wait()
            p.grad.div_(world)
    elif strategy == "gather-scatter":
        for p in params:
            grads = [torch.empty_like(p.grad) for _ in range(world)] if rank == 0 else None
            dist.gather(p.grad, gather_list=grads, dst=0)
            chunks = [torch.stack(grads).mean(dim=0)] * world if rank == 0 else None
            dist.scatter(p.grad, scatter_list=chunks, src=0)


def _rank(rank, world, port, strategy, async_op, model_name, batch, steps, threads, out_path):
    lifetime.settle()  # as a ddptop rank starts: what it inherited frozen, the collector on (off in a forked server)
    torch.set_num_threads(threads)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    cfg = RunConfig(model=model_name, sync=SyncConfig(batch_size=batch), synthetic_size=max(12800, batch * world * steps))
    torch.manual_seed(0)
    model = build_model(model_name)
    train_set, _ = build_datasets(cfg)
    loader, sampler = make_loader(train_set, batch, rank, world, 0, train=True)
    sampler.set_epoch(0)
    forward = DistributedDataParallel(model, bucket_cap_mb=25) if strategy == "ddp" else model
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    criterion = torch.nn.CrossEntropyLoss()
    times = []
    iterator = iter(loader)
    top = time.perf_counter()
    for _ in range(steps):  # a step: loop top to loop top, like ddptop's step boundaries
        inputs, labels = next(iterator)
        opt.zero_grad(set_to_none=True)
        loss = criterion(forward(inputs), labels)
        loss.backward()
        if strategy != "ddp":
            sync_gradients(model, strategy, rank, world, async_op)
        opt.step()
        loss.item()
        now = time.perf_counter()
        times.append(now - top)
        top = now
    if rank == 0:
        with open(out_path, "w") as f:
            f.write("\n".join(map(str, times)))
    dist.destroy_process_group()


def step_times(strategy, async_op=False, model="vgg11", batch=64, steps=12, world=2, threads=None,
               start_method="spawn"):
    """Rank 0's step times; the ranks start by `start_method` ("forkserver": from the server multiprocessing has,
    step_overhead.py's forked out of its own process as ddptop's CPU ranks are)."""
    from ddptop.control.store import free_port

    threads = threads or max(1, (os.cpu_count() or 1) // world)
    out = f"/tmp/ddptop-plain-{os.getpid()}.txt"
    mp.start_processes(_rank, args=(world, free_port(), strategy, async_op, model, batch, steps, threads, out),
                       nprocs=world, start_method=start_method)
    with open(out) as f:
        times = [float(x) for x in f.read().split()]
    os.unlink(out)
    return times


if __name__ == "__main__":
    print(statistics.median(step_times(sys.argv[1] if len(sys.argv) > 1 else "ddp")[2:]))
