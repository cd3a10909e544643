"""The per-rank training loop: segments of one sync configuration, steps measured by the step probe."""

from __future__ import annotations

import time
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch import nn

from ddptop.config import RunConfig, SyncConfig
from ddptop.control.agent import Decision
from ddptop.control.commands import ConfigApplied
from ddptop.errors import UsageError
from ddptop.events import EpochDone, Event, RunFinished, RunStarted
from ddptop.train.data import build_datasets, make_loader
from ddptop.train.models import build_model, layer_param_counts
from ddptop.train.strategies import Strategy, build_strategy


class Trainer:
    """Trains one rank. `emit` receives every event; it must not block (the bus queues them)."""

    def __init__(self, cfg: RunConfig, rank: int, world_size: int, device: torch.device,
                 emit: Callable[[Event], None], probe: Any, model: nn.Module | None = None):
        self.cfg = cfg
        self.rank = rank
        self.world_size = world_size
        self.device = device
        self.emit = emit
        self.probe = probe
        torch.manual_seed(cfg.seed)  # the same initial weights on every rank
        self.model = (model or build_model(cfg.model)).to(device)
        self.train_set, self.test_set = build_datasets(cfg)
        self.sync: SyncConfig | None = None
        self.strategy: Strategy | None = None
        self.segment = -1
        self.step = 0
        self.epoch = 0
        self.stop_reason = "done"

    # -- segments ---------------------------------------------------------------------------------------
    def start_segment(self, sync: SyncConfig) -> None:
        """Apply a sync configuration at a step boundary: rebuild what it changes, never mid-step."""
        if self.strategy is not None:
            self.strategy.teardown()
        previous = self.sync
        self.sync = sync
        self.segment += 1
        device_ids = [self.device.index] if self.device.type == "cuda" else None
        self.strategy = build_strategy(sync, self.rank, self.world_size, self.probe.comm, device_ids)
        self.forward_module = self.strategy.prepare(self.model)
        self.probe.watch(self.model, overlapped_backward=sync.strategy == "ddp")
        if previous is None or previous.batch_size != sync.batch_size:
            self.loader, self.sampler = make_loader(self.train_set, sync.batch_size, self.rank, self.world_size,
                                                    self.cfg.seed, train=True)
        if previous is None:
            self.optimizer = torch.optim.SGD(self.model.parameters(), lr=sync.lr, momentum=0.9, weight_decay=1e-4)
        for group in self.optimizer.param_groups:
            group["lr"] = sync.lr

    def check(self, sync: SyncConfig) -> None:
        """Rank 0 refuses a configuration this data cannot train before any rank sees it."""
        if sync.batch_size * self.world_size > len(self.train_set):
            raise UsageError(f"batch size {sync.batch_size} x {self.world_size} ranks is more than the "
                             f"{len(self.train_set)} training images")

    # -- the run ----------------------------------------------------------------------------------------
    def total_steps(self) -> int:
        if self.cfg.sweep:
            return len(self.cfg.sweep) * self.cfg.sweep_steps()
        return self.cfg.steps or len(self.loader) * self.cfg.epochs

    def _sweep_decision(self):
        """The sweep's next configuration when this step starts a new sweep segment (the same on every rank)."""
        per = self.cfg.sweep_steps()
        if not self.cfg.sweep or self.step == 0 or self.step % per:
            return None
        return Decision(0, self.cfg.sweep[self.step // per], f"sweep {self.cfg.profile}".strip())

    def run(self, agent=None) -> int:
        """Train until the step budget is spent or a stop arrives; `agent` is the control plane (None: no control)."""
        first = self.cfg.sweep[0] if self.cfg.sweep else self.cfg.sync
        self.start_segment(first)
        if self.rank == 0:
            self.emit(self._run_started())
        self.emit(ConfigApplied(self.rank, 0, 0, first.to_dict(), 0, "start", time.time()))
        criterion = nn.CrossEntropyLoss()
        total = self.total_steps()
        evaluated_at = -1
        iterator = self._epoch_iterator()
        while self.step < total:
            sweep = self._sweep_decision()
            if sweep is not None and self._switch(sweep, agent):
                iterator = self._epoch_iterator()
            if agent is not None:
                boundary = agent.boundary(self.step)
                if boundary.stop:
                    self.stop_reason = "stopped"
                    break
                if boundary.decision is not None and self._switch(boundary.decision, agent):
                    iterator = self._epoch_iterator()
            self.probe.start(self.step)
            try:
                inputs, labels = next(iterator)
            except StopIteration:  # end of an epoch
                if self.cfg.eval:
                    self._evaluate(criterion)
                    evaluated_at = self.step
                self.epoch += 1
                iterator = self._epoch_iterator()
                continue
            self._train_step(inputs.to(self.device, non_blocking=True), labels.to(self.device, non_blocking=True),
                             criterion)
            self._flush_events()
        if self.cfg.eval and self.stop_reason == "done" and evaluated_at != self.step:
            self._evaluate(criterion)
        self._flush_events(final=True)
        self.emit(RunFinished(self.rank, self.step, self.stop_reason, time.time()))
        return self.step

    def _epoch_iterator(self):
        self.sampler.set_epoch(self.epoch)
        return iter(self.loader)

    def _switch(self, decision, agent) -> bool:
        """Apply an agreed configuration before this step; True when the data loader was rebuilt."""
        rebuilt = decision.config.batch_size != self.sync.batch_size
        self.start_segment(decision.config)
        if agent is not None:
            agent.applied(decision, self.step, self.segment)
        self.emit(ConfigApplied(self.rank, self.step, self.segment, decision.config.to_dict(), decision.request_id,
                                decision.who, time.time()))
        # a new batch size restarts the epoch's shard with the new loader (the sampler's order is the same)
        return rebuilt

    def _train_step(self, inputs: torch.Tensor, labels: torch.Tensor, criterion: nn.Module) -> None:
        probe = self.probe
        probe.mark("data")
        self.optimizer.zero_grad(set_to_none=True)
        loss = criterion(self.forward_module(inputs), labels)
        probe.mark("fwd")
        loss.backward()
        probe.mark("bwd")
        self.strategy.after_backward()
        self.strategy.before_step()
        probe.mark("sync")
        self.optimizer.step()
        probe.mark("opt")
        probe.finish(loss, step=self.step, epoch=self.epoch, segment=self.segment,
                     batch_size=int(labels.shape[0]))
        self.step += 1

    def _flush_events(self, final: bool = False) -> None:
        for event in self.probe.drain(flush=final):
            self.emit(event)

    def _evaluate(self, criterion: nn.Module) -> None:
        """Test loss and accuracy over the whole test set: each rank scores its shard, sums are all-reduced."""
        loader, _ = make_loader(self.test_set, 256, self.rank, self.world_size, self.cfg.seed, train=False)
        self.model.eval()
        sums = torch.zeros(3, dtype=torch.float64)
        with torch.no_grad():
            for inputs, labels in loader:
                inputs, labels = inputs.to(self.device), labels.to(self.device)
                out = self.model(inputs)
                sums += torch.tensor([criterion(out, labels).item() * len(labels),
                                      (out.argmax(1) == labels).sum().item(), len(labels)], dtype=torch.float64)
        self.model.train()
        if self.world_size > 1:
            sums = sums.to(self.device)
            dist.all_reduce(sums)
            sums = sums.cpu()
        loss_sum, correct, count = sums.tolist()
        if self.rank == 0:
            self.emit(EpochDone(self.rank, self.epoch, self.step, loss_sum / max(count, 1), int(correct), int(count),
                                time.time()))

    def _run_started(self) -> RunStarted:
        params = [p for p in self.model.parameters() if p.requires_grad]
        sync = self.cfg.sync
        return RunStarted(
            model=self.cfg.model, dataset=self.cfg.dataset, world_size=self.world_size, strategy=sync.strategy,
            bucket_mb=sync.bucket_mb, async_op=sync.async_op, batch_size=sync.batch_size, lr=sync.lr,
            param_count=sum(p.numel() for p in params), param_bytes=sum(p.numel() * p.element_size() for p in params),
            param_tensors=len(params), layers=layer_param_counts(self.model), steps_per_epoch=len(self.loader),
            t=time.time(), total_steps=self.total_steps(), sweep_segments=len(self.cfg.sweep),
        )
