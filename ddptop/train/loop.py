"""The per-rank training loop: segments of one sync configuration, each started in one place, steps measured
from one step boundary to the next; a batch that grows is tried first and rolled back on every rank if it does
not fit.

A step is one optimizer step; it runs `accum` micro-steps (forward and backward of one batch each), the first
accum−1 without synchronizing gradients, the last one synchronized (README's glossary)."""

from __future__ import annotations

import contextlib
import time
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch import nn

from ddptop import metrics
from ddptop.config import BUCKETED, SHARDED, RunConfig, SyncConfig
from ddptop.control.agent import Decision
from ddptop.events import ConfigApplied
from ddptop.errors import UsageError
from ddptop.events import ClockSync, EpochDone, LogLine, OutOfMemory, RunFinished, RunStarted
from ddptop.metrics.buckets import same_layout
from ddptop.probes.clocksync import ping_pong
from ddptop.probes.memory import MemoryProbe
from ddptop.probes.own import now
from ddptop.sources.memory import UniqueMemory
from ddptop.train import batches, specs
from ddptop.train.data import make_loader
from ddptop.train.devices import check_strategy, loader_workers
from ddptop.train.models import layer_param_counts
from ddptop.train.save import SaveFailed, save
from ddptop.train.strategies import Strategy, build_strategy
from ddptop.train.strategies.base import momentum_by_name, plain_optimizer
from ddptop.train.strategies.fsdp import shard_units
from ddptop.train.sync_state import broadcast_state, fingerprint, model_bytes
from ddptop.testhooks import model_tweaks, rank_hooks


class Trainer:
    """Trains one rank. `emit` receives every event; it must not block (the bus queues them)."""

    def __init__(self, cfg: RunConfig, rank: int, world_size: int, device: torch.device,
                 emit: Callable[[Any], None], probe: Any, model: nn.Module | None = None, local_ranks: int = 1,
                 parts: specs.Parts | None = None):
        self.cfg = cfg
        self.rank = rank
        self.world_size = world_size
        self.device = device
        self.emit = emit
        self.probe = probe
        parts = parts or specs.build(cfg, model_tweaks(rank))  # seeded: the same initial weights on every rank
        self.model = (model or parts.model).to(device)
        self._layout = model_layout(self.model)  # before a sharded strategy releases the plain model's storage
        self.train_set, self.test_set = parts.train, parts.test
        self.criterion, self.unused, self.collate = parts.loss, parts.unused, parts.collate
        self.count_tokens = parts.tokens  # None: batches.tokens' own rule (an attention_mask summed)
        self.evaluates = cfg.eval and parts.classification and parts.test is not None  # accuracy means something
        self.no_eval = ("" if self.evaluates else "--no-eval" if not cfg.eval else
                        f"the loss is {cfg.loss}, not cross-entropy: accuracy is measured for a classifier under "
                        "cross-entropy only" if not parts.classification else "the data set has no test split")
        self.workers = loader_workers(cfg.workers, device.type, local_ranks)
        self.pin = device.type == "cuda"  # page-locked batches: the copy to the GPU really is asynchronous
        self.sync: SyncConfig | None = None
        self.strategy: Strategy | None = None
        self.optimizer: torch.optim.Optimizer | None = None
        self.segment = -1
        self.segment_start = 0
        self.step = 0
        self.epoch = 0
        self.stop_reason = "done"
        self._iterator = None
        self._trial: Decision | None = None  # the configuration to go back to if the next step does not fit
        self._rolled_back_at = -1  # the step a roll-back happened at: a sweep does not retry its switch there
        self._lr_from = 0  # the step lr or lr_warmup_steps was last set at: the warm-up counts from here
        # each rank's memory by kind (issue 43), on a cadence; `--probes off` measures nothing of ddptop's own
        self.memory = memory_probe(cfg, rank, device, emit, probe.own)

    # -- segments ---------------------------------------------------------------------------------------
    def start_segment(self, decision: Decision, agent=None) -> None:
        """The one place a segment starts (the first one, a sweep's next one, a live switch), at a step boundary.

        Rebuilds what the configuration changes; when the previous segment let the ranks drift apart
        (`single`) and the new one synchronizes gradients, every rank takes rank 0's parameters, buffers and
        optimizer state first, so all ranks train one model again. The bytes that costs and the switch's time
        are reported once, in ConfigApplied, with the model's fingerprint."""
        began = now()
        sync, previous = decision.config, self.sync
        # a larger batch is tried first: its first step runs without collectives (_trial_step)
        trial = previous is not None and sync.batch_size > previous.batch_size
        self._trial = Decision(decision.request_id, previous, decision.who) if trial else None
        self._leave(sync)
        sync_bytes = resync(self.model, self.optimizer, previous, sync, self.world_size)
        self.sync = sync
        self.segment += 1
        self.segment_start = self.step
        self.strategy, self.forward_module = build_for(self.model, sync, self.rank, self.world_size, self.device,
                                                       self.probe, find_unused=bool(self.unused))
        if self.strategy.owns_optimizer:  # zero1/2/3: their optimizer, holding the plain one's momentum
            self.optimizer = self.strategy.build_optimizer(sync.lr, momentum_by_name(self.model, self.optimizer))
        if previous is None or (previous.lr, previous.lr_warmup_steps) != (sync.lr, sync.lr_warmup_steps):
            self._lr_from = self.step
        if previous is None or previous.batch_size != sync.batch_size:
            # a new batch size restarts the epoch's shard with the new loader (the sampler's order is the same)
            self.loader, self.sampler = make_loader(self.train_set, sync.batch_size, self.rank, self.world_size,
                                                    self.cfg.seed, train=True, workers=self.workers, pin=self.pin,
                                                    collate=self.collate)
            self._iterator = None
        self._set_lr()
        if self.memory is not None:  # every segment is measured at its first step, the strategy's state then built
            self.memory.watch(self.strategy.module())  # zero2/3: the shards' module (the plain one is released)
            self.memory.due_now()
        print_ = fingerprint(self.strategy.full_parameters())
        if agent is not None:  # a trial's `set` is answered once every rank knows whether the batch fits
            agent.applied(decision, self.step, self.segment, answer=not trial)
        switch_s = now() - began
        self.probe.aside(switch_s)
        self.emit(ConfigApplied(self.rank, self.step, self.segment, sync.to_dict(), decision.request_id,
                                decision.who, time.time(), fingerprint=print_, sync_bytes=sync_bytes,
                                switch_s=switch_s, steps_per_epoch=self.steps_per_epoch()))

    def _leave(self, sync: SyncConfig) -> None:
        """Tear the segment's strategy down; the plain model then holds the full parameters again. A strategy that
        owned the optimizer hands its momentum over (full tensors by name, on every rank) to the loop's plain SGD,
        the home of the optimizer state between segments (resync broadcasts it after `single`; a zero strategy
        takes it from there)."""
        leaving, carried = self.strategy, None
        if leaving is not None and leaving.owns_optimizer:
            carried = leaving.export_momentum()
        if leaving is not None:
            leaving.teardown()
        if self.optimizer is None or carried is not None:
            self.optimizer = plain_optimizer(self.model, sync.lr, carried)

    def steps_per_epoch(self) -> int:
        """Optimizer steps per epoch: the shard's micro-batches over accum (a step may span two epochs)."""
        return max(1, len(self.loader) // self.sync.accum)

    def _set_lr(self) -> None:
        """lr, or during a gradual warm-up (Goyal et al.) lr·(k+1)/N at the k-th step since lr was set."""
        sync, lr = self.sync, self.sync.lr
        if sync.lr_warmup_steps:
            lr *= min(1.0, (self.step - self._lr_from + 1) / sync.lr_warmup_steps)
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    def check(self, sync: SyncConfig) -> None:
        """Rank 0 refuses a configuration this data cannot train before any rank sees it."""
        if self.device.type == "cuda" and dist.is_initialized():  # gloo moves CUDA tensors for some collectives only
            check_strategy("cuda", dist.get_backend(), sync.strategy)
        if sync.strategy in SHARDED:
            shard_units(self.model, sync.shard_unit)  # a unit that names no module: one line, the job unchanged
        if sync.batch_size * self.world_size > len(self.train_set):
            raise UsageError(f"batch size {sync.batch_size} x {self.world_size} ranks is more than the "
                             f"{len(self.train_set)} training {'images' if specs.samples_are_images(self.cfg.dataset) else 'samples'}")

    # -- the run ----------------------------------------------------------------------------------------
    def total_steps(self) -> int:
        if self.cfg.sweep:
            return len(self.cfg.sweep) * self.cfg.sweep_steps()
        return self.cfg.steps or max(1, len(self.loader) * self.cfg.epochs // self.sync.accum)

    def _sweep_decision(self) -> Decision | None:
        """The sweep's next configuration when this step starts a new sweep segment (the same on every rank)."""
        per = self.cfg.sweep_steps()
        if not self.cfg.sweep or self.step == 0 or self.step % per or self.step == self._rolled_back_at:
            return None
        return Decision(0, self.cfg.sweep[self.step // per], f"sweep {self.cfg.profile}".strip())

    def run(self, agent=None) -> int:
        """Train until the step budget is spent or a stop arrives; `agent` is the control plane (None: no control)."""
        self.start_segment(Decision(0, self.cfg.first_sync, "start"))
        if self.rank == 0:
            started = self._run_started()
            self.emit(started)
            self._sweep_warning(started)
            if self.unused:
                self.emit(LogLine(self.rank, "warning", specs.unused_note(self.unused), time.time()))
        self._sync_clocks("start", agent)
        time.sleep(rank_hooks(self.rank).start_s)  # test-only (testhooks: start=RANK:MS): 0 otherwise
        criterion = self.criterion
        total = self.total_steps()
        self._evaluated_at = -1
        probe = self.probe
        while self.step < total:
            probe.begin()
            if not self._boundary(agent):
                break
            probe.ready(self.step, self.segment, self.segment_start)
            if self.memory is not None:
                self.memory.begin()
            batch = self._next_batch(criterion)
            if self._trial is None:
                self._train_step(batch, criterion)
            elif not self._trial_step(batch, criterion, agent):
                break
        probe.close()  # waits for the device once, so the last step's marks can be read
        self._sync_clocks("end", agent)  # every rank leaves the loop at the same step (a stop is broadcast)
        if self.evaluates and self.stop_reason == "done" and self._evaluated_at != self.step:
            self._evaluate(criterion)
        self._finish()
        return self.step

    def _sync_clocks(self, at: str, agent) -> None:
        """Rank 0 reports every rank's wall clock against its own (probes.clocksync), at the run's start and end:
        the straggler analysis aligns the ranks' span times with it. It runs outside every step (a few ms)."""
        group = getattr(agent, "group", None)
        if group is None or self.world_size < 2 or not getattr(self.probe, "detail", False):
            return
        peers = ping_pong(group, self.rank, self.world_size, self.probe.wall)
        if self.rank == 0:
            self.emit(ClockSync(0, at, self.probe.wall(), peers))

    def _boundary(self, agent) -> bool:
        """The step boundary: a sweep's switch, then the control exchange (ddptop's cost; a pause is set aside).
        False when every rank is to stop here."""
        sweep = self._sweep_decision()
        if sweep is not None:
            self.start_segment(sweep, agent)
        if agent is None:
            return True
        boundary = exchange(agent, self.probe, self.step)
        if boundary.stop:
            self.stop_reason = "stopped"
            return False
        if boundary.decision is not None:
            self.start_segment(boundary.decision, agent)
        return True

    def _next_batch(self, criterion: nn.Module) -> Any:
        """The next batch, as the loader and the user's collate_fn made it; at an epoch's end, the test pass (set
        aside: not part of any step) and a new epoch."""
        while True:
            if self._iterator is None:
                self.sampler.set_epoch(self.epoch)
                self._iterator = iter(self.loader)
            try:
                return next(self._iterator)
            except StopIteration:
                began = now()
                if self.evaluates:
                    self._evaluate(criterion)
                    self._evaluated_at = self.step
                self.epoch += 1
                self._iterator = None
                self.probe.aside(now() - began)

    def _train_step(self, batch: Any, criterion: nn.Module) -> None:
        probe = self.probe
        self.optimizer.zero_grad(set_to_none=True)
        loss, samples, tokens = self._micro_steps(batch, criterion, self.forward_module, self.strategy.micro_step)
        self.strategy.after_backward()
        self.strategy.before_step()
        probe.mark("sync")
        self._set_lr()
        self.optimizer.step()
        probe.mark("opt")
        probe.finish(loss, epoch=self.epoch, batch_size=samples, tokens=tokens)
        self._measure_memory()
        self.step += 1

    def _measure_memory(self) -> None:
        """A sampled step's memory by kind (probes.memory): at its end, the gradients still held, before the next
        step's zero_grad."""
        if self.memory is not None:
            self.memory.finish(self.optimizer, self.step, self.segment)

    def _micro_steps(self, batch: Any, criterion: nn.Module, module: nn.Module,
                     context: Callable[[bool], Any]) -> tuple[torch.Tensor, int, int]:
        """The step's accum micro-steps, gradients summed in place; (the mean loss, samples, tokens trained).

        A batch is called as train/batches.py's rule says (a pair: loss(model(inputs), target); else
        loss(model(batch), batch)), every tensor in it moved to the device; its samples are its first tensor's
        first dimension, so variable batches are counted as they come; its tokens as it says (batches.tokens), counted
        before the move to the device.

        Each micro-step's loss is divided by accum, so the summed gradient is the mean over all accum·b samples;
        `context(last)` wraps each (DDP: no_sync() for all but the last). The phase marks belong to the last,
        synchronized micro-step (`data` the first batch's); the accum−1 before it are marked apart (their spans say
        "no sync"), the last of those marks ending them (StepDone.micro_s)."""
        probe, accum = self.probe, self.sync.accum
        losses, samples, tokens = [], 0, 0
        for index in range(accum):
            last = index == accum - 1
            if index:
                batch = self._next_batch(criterion)
            tokens += batches.tokens(batch, self.count_tokens)
            batch = batches.to_device(batch, self.device)
            inputs, targets = batches.split(batch)
            probe.mark("data") if index == 0 else probe.micro("data", last)
            with context(last):
                loss = criterion(module(inputs), targets)
                probe.mark("fwd") if last else probe.micro("fwd")
                (loss / accum if accum > 1 else loss).backward()
            if not last:
                probe.micro("bwd")
            losses.append(loss.detach())
            samples += batches.size(batch) or 0
        probe.mark("bwd")
        return (losses[0] if accum == 1 else torch.stack(losses).mean()), samples, tokens

    def _trial_step(self, batch: Any, criterion: nn.Module, agent) -> bool:
        """The first step after the batch grew. Forward and backward run without any collective (DDP's plain
        module), so a rank that runs out of GPU memory leaves no peer waiting inside one; one all-reduce over
        the control group then tells every rank which ranks ran out. If none did, the step ends as the strategy
        would end it (its collectives, then the optimizer); else every rank rolls back at this step.
        False: stop here (a sweep that grows the batch until it does not fit)."""
        probe, loss = self.probe, None
        try:
            self.optimizer.zero_grad(set_to_none=True)
            loss, samples, tokens = self._micro_steps(batch, criterion, self.strategy.trial_module(),
                                              lambda last: contextlib.nullcontext())
        except torch.cuda.OutOfMemoryError:  # leaving this block drops the traceback and the tensors it held
            loss = None
        del batch
        began = now()
        failed = agent.out_of_memory(loss is None) if agent is not None else ([] if loss is not None else [self.rank])
        probe.own.add(now() - began)  # 8 bytes per rank over gloo, once per batch increase
        trial, self._trial = self._trial, None
        if failed:
            del loss
            return self._roll_back(trial, failed, agent)
        self.strategy.trial_sync()
        probe.mark("sync")
        self._set_lr()
        self.optimizer.step()
        probe.mark("opt")
        probe.finish(loss, epoch=self.epoch, batch_size=samples, tokens=tokens)
        self._measure_memory()
        self.step += 1
        if agent is not None:
            agent.answer(trial.request_id, self.step - 1, self.segment)
        return True

    def _roll_back(self, trial: Decision, failed: list[int], agent) -> bool:
        """Every rank, at the same step: free the failed batch's memory, report, go back to `trial.config`."""
        tried = self.sync.batch_size
        self.optimizer.zero_grad(set_to_none=True)
        if self.device.type == "cuda":
            torch.cuda.empty_cache()  # hand the failed batch's cached blocks back to the driver
        stop = bool(self.cfg.sweep) and self.cfg.sweep_until_oom
        event = OutOfMemory(self.rank, self.step, self.segment, tried, 0 if stop else trial.config.batch_size,
                            tuple(failed), time.time())
        if self.rank == 0:
            self.emit(event)
        self._rolled_back_at = self.step
        if stop:
            return False
        self.start_segment(Decision(0, trial.config, f"roll-back: batch {tried} does not fit"), agent)
        if agent is not None:
            agent.answer(trial.request_id, self.step, self.segment, error=f"rolled back at step {self.step}: "
                                                                          f"{event.describe()}")
        return True

    def _finish(self) -> None:
        """The run's last word: the final fingerprint, and (`--save`) rank 0's model on disk (a sharded
        strategy gives the plain model its full parameters back first)."""
        if self.strategy is not None and self.strategy.owns_optimizer:
            self.strategy.teardown()
            self.strategy = None
        print_ = fingerprint(self.model)
        if self.rank == 0 and self.cfg.save:
            try:
                save(self.model.state_dict(), self.cfg.save)
            except SaveFailed as exc:
                self.emit(LogLine(self.rank, "error", str(exc), time.time()))  # in the recording too
                self.emit(RunFinished(self.rank, self.step, self.stop_reason, time.time(), fingerprint=print_))
                raise
        self.emit(RunFinished(self.rank, self.step, self.stop_reason, time.time(), fingerprint=print_))

    def _evaluate(self, criterion: nn.Module) -> None:
        """Test loss and accuracy over the whole test set: each rank scores its shard, sums are all-reduced."""
        loader, _ = make_loader(self.test_set, 256, self.rank, self.world_size, self.cfg.seed, train=False,
                                collate=self.collate)
        model = self.strategy.module() if self.strategy is not None else self.model  # zero2/3: the shards' module
        model.eval()
        sums = torch.zeros(3, dtype=torch.float64)
        with torch.no_grad():
            for batch in loader:  # cross-entropy only (Trainer.evaluates): pairs, specs.try_batch saw to it
                inputs, labels = batches.split(batches.to_device(batch, self.device))
                out = model(inputs)
                sums += torch.tensor([criterion(out, labels).item() * len(labels),
                                      (out.argmax(1) == labels).sum().item(), len(labels)], dtype=torch.float64)
        model.train()
        if self.world_size > 1:
            sums = sums.to(self.device)
            dist.all_reduce(sums)
            sums = sums.cpu()
        loss_sum, correct, count = sums.tolist()
        if self.rank == 0:
            self.emit(EpochDone(self.rank, self.epoch, self.step, loss_sum / max(count, 1), int(correct), int(count),
                                time.time()))

    def _sweep_warning(self, started: RunStarted) -> None:
        """Say at the start when a bucket-size sweep cannot change anything (every size: the same buckets)."""
        sizes = [c.bucket_mb for c in self.cfg.sweep if c.strategy == "ddp"]
        why = same_layout(started.layers, started.param_bytes / max(started.param_count, 1), sizes)
        if why:
            self.emit(LogLine(self.rank, "warning", why, time.time()))

    def _run_started(self) -> RunStarted:
        sync = self.sync  # the configuration segment 0 runs
        return RunStarted(
            model=self.cfg.model, dataset=self.cfg.dataset, world_size=self.world_size, strategy=sync.strategy,
            bucket_mb=sync.bucket_mb, async_op=sync.async_op, batch_size=sync.batch_size, lr=sync.lr,
            **self._layout, steps_per_epoch=self.steps_per_epoch(), t=time.time(),
            total_steps=self.total_steps(), sweep_segments=len(self.cfg.sweep),
            warmup=metrics.warmup_for(self.cfg.to_dict()), accum=sync.accum, no_eval=self.no_eval,
            backend=dist.get_backend() if dist.is_initialized() else "",
        )


# -- what a segment's start and the run's start need, shared with the user's own loop (ddptop/api.py) ----------
def resync(model: nn.Module, optimizer: torch.optim.Optimizer, previous: SyncConfig | None, sync: SyncConfig,
           world_size: int) -> int:
    """Bring every rank to one model before `sync` runs; returns the bytes that costs (ConfigApplied.sync_bytes).

    After `single` the ranks drifted apart: rank 0's parameters, buffers and optimizer state go to every rank
    (DDP broadcasts parameters and buffers itself when built, so only the optimizer state then)."""
    sync_bytes = 0
    if previous is not None and previous.strategy == "single" and sync.strategy != "single" and world_size > 1:
        sync_bytes += broadcast_state(model, optimizer, with_model=sync.strategy not in BUCKETED)
    if sync.strategy in BUCKETED and world_size > 1:
        sync_bytes += model_bytes(model)  # DDP broadcasts rank 0's parameters and buffers when built
    return sync_bytes


def memory_probe(cfg: RunConfig, rank: int, device: torch.device, emit: Callable[[Any], None],
                 own: Any) -> MemoryProbe | None:
    """Each rank's memory by kind (issue 43), sampled on a cadence; None under `--probes off`, which measures nothing
    of ddptop's own."""
    if cfg.probes == "off":
        return None
    return MemoryProbe(rank, device, emit, own, None if device.type == "cuda" else UniqueMemory())


def exchange(agent, probe: Any, step: int):
    """The control exchange at a step boundary (control/agent.py): ddptop's cost, a pause set aside."""
    began = now()
    boundary = agent.boundary(step)
    probe.own.add(now() - began - boundary.waited_s)
    probe.aside(boundary.waited_s)
    return boundary


def build_for(model: nn.Module, sync: SyncConfig, rank: int, world_size: int, device: torch.device,
              probe: Any, find_unused: bool = False) -> tuple[Strategy, nn.Module]:
    """The strategy for `sync` on `model`, and the module to run forward on; the probe watches the plain model.
    `find_unused`: the model has parameters that get no gradient (DDP's find_unused_parameters; the others send
    zeros for them)."""
    device_ids = [device.index] if device.type == "cuda" else None
    strategy = build_strategy(sync, rank, world_size, probe.comm, device_ids)
    strategy.find_unused = find_unused
    forward_module = strategy.prepare(model)
    probe.watch(strategy.module(), overlapped_backward=sync.strategy in BUCKETED)
    return strategy, forward_module


def model_layout(model: nn.Module) -> dict[str, Any]:
    """RunStarted's description of the trained parameters (those that receive gradients)."""
    params = [p for p in model.parameters() if p.requires_grad]
    return {"param_count": sum(p.numel() for p in params),
            "param_bytes": sum(p.numel() * p.element_size() for p in params), "param_tensors": len(params),
            "layers": layer_param_counts(model), "param_shapes": tuple(tuple(p.shape) for p in params)}
