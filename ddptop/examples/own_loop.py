"""Your own training loop, profiled and switched live by ddptop (docs/how-to/own-loop.md).

    torchrun --nproc-per-node 2 -m ddptop.examples.own_loop   # then, from another shell: ddptop ctl set strategy=allreduce

(or a copy of this file of yours: `torchrun --nproc-per-node 2 own_loop.py`).

The model, data, loss, optimizer, scheduler and loop are this script's own; ddptop only wraps the model (its gradient
sync becomes ddptop's strategy, switched live between two steps) and marks the steps.
"""

import os

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

from ddptop.api import join

STEPS = int(os.environ.get("OWN_LOOP_STEPS", "300"))

job = join(strategy="ddp", log_every=20)  # torchrun or Slurm environment
torch.manual_seed(0)
features = torch.randn(4096, 32)
targets = features @ torch.randn(32, 1) + 0.1 * torch.randn(4096, 1)  # a regression set a model can learn
model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
model, optimizer = job.prepare(model, optimizer)  # the job starts here (rank 0: the recording and `ctl`)
scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=100, gamma=0.5)
sampler = DistributedSampler(TensorDataset(features, targets), num_replicas=job.world_size, rank=job.rank)
loader = DataLoader(TensorDataset(features, targets), batch_size=32, sampler=sampler, drop_last=True)
loss_fn = nn.MSELoss()

epoch = 0
while job.step_count < STEPS and not job.stopped:
    sampler.set_epoch(epoch)
    for inputs, labels in loader:
        if job.step_count >= STEPS or job.stopped:  # every rank stops at the same step
            break
        with job.step(batch_size=len(inputs), epoch=epoch):
            inputs, labels = inputs.to(job.device), labels.to(job.device)
            loss = loss_fn(model(inputs), labels)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            job.log(loss=loss)
        scheduler.step()
    epoch += 1
job.finish()
