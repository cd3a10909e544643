"""The user's own training loop, profiled and switched live by ddptop (README: "Your own training loop").

    from ddptop.api import join
    job = join()                                       # under torchrun or Slurm, as the script already runs
    model, optimizer = job.prepare(model, optimizer)   # the job starts here; ddptop owns gradient sync from now on
    for inputs, targets in loader:
        with job.step(batch_size=len(inputs)):         # a step boundary on each side: switches land there
            loss = loss_fn(model(inputs), targets); loss.backward(); optimizer.step(); optimizer.zero_grad()
            job.log(loss=loss)

A batch of any structure your collate_fn makes (a dict, nested tuples): `job.step(batch=batch)` reads its size
(the first dimension of its first tensor) and `job.to_device(batch)` moves every tensor in it. Tokens for tokens/s:
`job.step(batch=batch, tokens=n)` (your count), or a dict batch's `attention_mask` summed when no count is given.
An exception the loop does not catch (torch's "Expected to have finished reduction" when a parameter gets no
gradient under ddp: join(find_unused_parameters=True)) ends the job cleanly: every rank's last word is recorded,
the recording is closed, one line says what happened and the process exits 1 (DDPTOP_DEBUG=1: the traceback).

The loop, data, optimizer, scheduler and mixed precision stay the user's. `prepare` returns the user's optimizer
and a thin module (OwnModel) whose `inner` is the strategy's module (the plain model, or DDP around it): a switch
replaces `inner` between two steps, and the parameters stay the same tensors, so the optimizer never notices.
Everything else is ddptop's own machinery, shared with its loop: train/direct.py's `hosting` (rank 0's store and
collector), train/worker.py's `joined` (handshake, groups, the front's sockets, system samples), train/loop.py's `resync`,
`build_for` and `exchange`, control/agent.py's agreement on the switch step, probes/step.py's phases.

Phases: `data` ends where the step is entered (the user's loader ran since the last boundary); `fwd` where
backward reaches the model's output (a hook on it); `bwd` and `sync` at the end of backward (autograd's final
callbacks, after DDP's own: a non-DDP strategy syncs there, so every rank's GradScaler sees the same gradients);
`opt` when `optimizer.step` returns (torch.optim's step post-hook).
"""

from __future__ import annotations

import atexit
import math
import os
import signal
import sys
import time
from contextlib import ExitStack
from typing import Any, Callable

import torch
from torch import nn

from ddptop import metrics, rendezvous
from ddptop.config import MAX_BATCH_SIZE, ZERO, RunConfig, SyncConfig
from ddptop.control.agent import ControlAgent, Decision
from ddptop.errors import DataError, DdptopError, JobStopped, UsageError, say_line
from ddptop.events import ConfigApplied, RunFinished, RunStarted
from ddptop.probes.own import now
from ddptop.train import batches
from ddptop.train.loop import build_for, exchange, memory_probe, model_layout, resync
from ddptop.train.sync_state import broadcast_state, fingerprint

def refuse_zero(strategy: str) -> None:
    """zero1/2/3 build the optimizer (its state sharded) and zero2/3 replace the model's parameters by shards: an
    own loop keeps its own model and optimizer, so ddptop cannot run them there."""
    if strategy in ZERO:
        raise UsageError(f"{strategy} shards the optimizer state ddptop builds; an own loop keeps its own optimizer "
                         "and model, so it takes single, gather-scatter, allreduce or ddp (ddptop run trains zero1-3)")


# what `ctl set` may change in a job whose loop is the user's: the strategy ddptop builds around the model applies
# these; every other setting ddptop's own loop applies is the script's (OWNED_BY_LOOP), refused by rank 0
OWN_SETTINGS = ("strategy", "bucket_mb", "async_op", "compress")
OWNED_BY_LOOP = {"batch_size": "DataLoader", "lr": "optimizer and scheduler",
                 "accum": "steps (one job.step is one optimizer step)", "lr_warmup_steps": "optimizer and scheduler",
                 "shard_unit": "model (zero2 and zero3, which shard it, are refused here)"}
LOST_AFTER_S = 10.0  # the front marks a rank lost after this long without a heartbeat (ddptop's own default)
_joined: list["Job"] = []  # one job per process: torch has one default process group


def join(*, strategy: str = "ddp", bucket_mb: float = 25.0, async_op: bool = False, record: str | None = None,
         no_record: bool = False, log_every: int = 10, probes: str = "all", span_every: int = 0,
         token: str | None = None, master: str | None = None, port: int | None = None, rank: int | None = None,
         world_size: int | None = None, backend: str = "auto", device: str = "auto", timeout_s: float = 60.0,
         collective_timeout_s: float = 300.0, find_unused_parameters: bool = False) -> "Job":
    """This process's rank of a job: from torchrun's or Slurm's environment, else master/rank/world_size. Nothing
    starts until `prepare`; flags are checked now (a bad one: UsageError, exit 2). `find_unused_parameters`: the
    model has parameters that get no gradient in some steps (DDP's flag of that name, which walks the autograd graph
    after every forward; the other strategies send zeros for them whatever it says)."""
    _one_line_errors()
    if _joined:
        raise UsageError("ddptop.api.join() was called twice in one process: keep the job it returned")
    refuse_zero(strategy)
    rdv = rendezvous.resolve(master, port, rank, world_size, None)
    if rdv.source == "local":
        raise UsageError("ddptop.api.join() is one rank of a job: run the script under torchrun "
                         "(torchrun --nproc-per-node 2 train.py) or Slurm (srun), or give master=, rank=, "
                         "world_size=")
    cfg = RunConfig(sync=SyncConfig(strategy=strategy, bucket_mb=bucket_mb, async_op=async_op), backend=backend,
                    device=device, probes=probes, span_every=span_every, eval=False)
    if not isinstance(log_every, int) or isinstance(log_every, bool) or log_every < 1:
        raise UsageError(f"log_every must be a whole number ≥ 1, got {log_every!r}")
    if not isinstance(find_unused_parameters, bool):
        raise UsageError(f"find_unused_parameters must be True or False, got {find_unused_parameters!r}")
    from ddptop.front.run import records_here

    if record and not records_here(rdv):
        record = None  # rank 0 records every rank
    elif records_here(rdv):
        from ddptop.record.paths import check_new, choose

        record = choose(record, no_record, "own")
        if record:
            check_new(record)
    job = Job(cfg, rdv, (token, timeout_s, collective_timeout_s), log_every, record)
    job.find_unused = find_unused_parameters
    _joined.append(job)
    return job


class OwnModel(nn.Module):
    """What `prepare` hands back: forward runs `inner`, the strategy's module for the current segment."""

    def __init__(self, model: nn.Module, on_output: Callable[[Any], None] | None = None):
        super().__init__()
        self.inner = model
        self._plain = [model, on_output]  # in a list: neither is a second submodule

    @property
    def module(self) -> nn.Module:
        """The user's model itself (as DDP's `.module`)."""
        return self._plain[0]

    def forward(self, *args, **kwargs):
        out = self.inner(*args, **kwargs)
        if self._plain[1] is not None:
            self._plain[1](out)
        return out

    def state_dict(self, *args, **kwargs):
        """The user's model's own keys, whatever the strategy (no `inner.` or DDP's `module.` prefix)."""
        return self.module.state_dict(*args, **kwargs)

    def load_state_dict(self, *args, **kwargs):
        return self.module.load_state_dict(*args, **kwargs)


class Job:
    """One rank of a job whose loop is the user's. Made by `join`."""

    def __init__(self, cfg: RunConfig, rdv, options: tuple, log_every: int, record: str | None):
        self.cfg, self.rdv, self._options, self.log_every, self.record = cfg, rdv, options, log_every, record
        self.rank, self.world_size = rdv.rank, rdv.world_size
        self.device: torch.device | None = None  # this rank's device, once prepared (batches go there)
        self.model: nn.Module | None = None  # the plain model
        self.stopped = False  # `ctl stop` arrived: end the loop (the next `step` raises JobStopped, exit 0)
        self.step_count = 0
        self.find_unused = False  # join(find_unused_parameters=...): passed to every strategy ddptop builds
        self._stack: ExitStack | None = None
        self._rank = self._probe = self._agent = self.strategy = self.sync = self._memory = None
        self._segment, self._segment_start, self._in_step = -1, 0, False
        self._loss: Any = None
        self._synced = self._closed = False

    # -- the user's calls ---------------------------------------------------------------------------------
    def prepare(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> tuple[nn.Module, torch.optim.Optimizer]:
        """Join the job, make every rank's model and optimizer state rank 0's, and hand back the model to train
        (an OwnModel) and the same optimizer. The first strategy is built at the first step."""
        if self._stack is not None:
            raise UsageError("job.prepare was called twice: one model and optimizer per job")
        if not isinstance(model, nn.Module) or not isinstance(optimizer, torch.optim.Optimizer):
            raise UsageError(f"job.prepare takes an nn.Module and a torch.optim.Optimizer, got "
                             f"{type(model).__name__} and {type(optimizer).__name__}")
        params = {id(p) for p in model.parameters()}
        if any(id(p) not in params for group in optimizer.param_groups for p in group["params"]):
            raise UsageError("the optimizer holds tensors that are not the model's parameters: build it from "
                             "model.parameters() before job.prepare")
        from ddptop.front.run import rank_options
        from ddptop.train.direct import hosting
        from ddptop.train.worker import joined, make_probe

        self._stack = ExitStack()
        atexit.register(self.finish)
        token, timeout_s, collective_timeout_s = self._options
        options = rank_options(self.rdv, token, timeout_s, LOST_AFTER_S, collective_timeout_s,
                               token_by="join(token=...)")  # an API user has no --token to pass
        config = {**self.cfg.to_dict(), "model": f"own:{type(model).__name__}", "dataset": "own"}
        options = self._stack.enter_context(hosting(config, self.rdv, options, self.log_every, self.record,
                                                     own_store=True))
        self._rank = self._stack.enter_context(joined(self.cfg, self.rdv, options, model))
        self.device = self._rank.device
        self.model, self.optimizer = model.to(self.device), optimizer  # .to keeps the same Parameter objects
        self._probe = make_probe(self.cfg, self.rank, self.rdv.world_size, self.device, self._rank.emit)
        self._memory = memory_probe(self.cfg, self.rank, self.device, self._rank.emit, self._probe.own)
        # ranks that built their models apart start from rank 0's (DDP would; the other strategies do not)
        self._start_bytes = broadcast_state(model, optimizer) if self.world_size > 1 else 0
        self.wrapper = OwnModel(model, self._forward_done)
        optimizer.register_step_pre_hook(self._before_optimizer)
        optimizer.register_step_post_hook(self._after_optimizer)
        return self.wrapper, optimizer

    def step(self, batch_size: int | None = None, epoch: int = 0, *, batch: Any = None,
             tokens: Any = None) -> "_Step":
        """`with job.step(batch_size=len(inputs)):` around one training step (forward, backward, optimizer); or
        `job.step(batch=batch)`: the size is the first dimension of the batch's first tensor (any structure).
        `tokens`: the step's token count (a whole number; tokens/s), else a dict batch's `attention_mask` summed
        (train/batches.tokens), else none."""
        if self._stack is None:
            raise UsageError("job.step before job.prepare: prepare the model and optimizer first")
        if (batch_size is None) == (batch is None):
            raise UsageError("job.step takes batch_size= or batch= (one of them)")
        if batch is not None:
            batch_size = batches.size(batch)
            if batch_size is None:
                raise UsageError(f"job.step(batch=...) found no tensor with a first dimension in "
                                 f"{batches.describe(batch)}: give batch_size= instead")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise UsageError(f"job.step's batch_size must be a whole number ≥ 1, got {batch_size!r}")
        try:
            count = batches.whole_tokens(tokens, "job.step's tokens") if tokens is not None else (
                batches.tokens(batch) if batch is not None else 0)
        except DataError as exc:  # a wrong argument of the API's: its usage error
            raise UsageError(str(exc)) from None
        return _Step(self, batch_size, epoch, count)

    def to_device(self, batch: Any) -> Any:
        """The batch with every tensor in it on this rank's device (non_blocking), its structure kept."""
        if self.device is None:
            raise UsageError("job.to_device before job.prepare: the device is chosen there")
        return batches.to_device(batch, self.device)

    def log(self, loss: Any) -> None:
        """The step's loss (a number or a 0-d tensor: read off the training thread, never synchronizing)."""
        self._loss = loss.detach() if isinstance(loss, torch.Tensor) else torch.tensor(float(loss))

    def finish(self) -> None:
        """The run's end (also at exit): the last step's record, the final fingerprint, every rank leaves."""
        if self._closed or self._stack is None:
            return
        self._closed = True
        if self._probe is not None:
            self._probe.close()
            reason = "stopped" if self.stopped else "done"
            self._rank.emit(RunFinished(self.rank, self.step_count, reason, time.time(),
                                        fingerprint=fingerprint(self.model)))
        self._stack.close()
        say_line(f"ddptop: rank {self.rank} finished {self.step_count} steps")

    def _crash(self, exc: BaseException, tb, own: bool) -> None:
        """The loop ended with an exception: this rank's last record says so (`own`: the loop's, not ddptop's), then
        the job closes as at a normal end. torchrun ends every rank's process group (SIGTERM) as soon as one
        rank exits non-zero: a rank sending its last events, or rank 0 closing the recording (its collector), must
        not be cut off by that (torchrun's SIGKILL follows 30 s later)."""
        self._closed = True
        with ExitStack() as later:
            if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
                signal.signal(signal.SIGTERM, signal.SIG_IGN)
                later.callback(signal.signal, signal.SIGTERM, signal.SIG_DFL)
            if own and self._probe is not None and self._rank is not None:
                text = (str(exc).strip().splitlines() or [""])[0].split(". ")[0][:200]
                self._rank.emit(RunFinished(self.rank, self.step_count, f"error: {type(exc).__name__}: {text}",
                                            time.time(), fingerprint=fingerprint(self.model)))
            self._stack.__exit__(type(exc), exc, tb)

    def __enter__(self) -> "Job":
        return self

    def __exit__(self, *exc) -> None:
        if exc[0] is None:
            self.finish()

    # -- step boundaries ------------------------------------------------------------------------------------
    def _enter(self, batch_size: int, epoch: int, tokens: int = 0) -> None:
        if self.stopped:
            raise JobStopped(f"stopped by ctl at step {self.step_count}")
        if self._in_step:
            raise UsageError("job.step inside job.step: one step at a time")
        if self.sync is None:  # the first step: segment 0 (it gives the batch size), then the first boundary
            self._first_segment(batch_size)
            self._boundary()
        if self.stopped:
            raise JobStopped(f"stopped by ctl at step {self.step_count}")
        self._in_step, self._synced, self._loss = True, False, None
        self._batch, self._epoch, self._tokens = batch_size, epoch, tokens
        self._mark("data")

    def _exit(self) -> None:
        self._in_step = False
        self._mark("opt")
        loss = self._loss if self._loss is not None else torch.tensor(math.nan)  # no job.log: shown as nan
        self._probe.finish(loss, epoch=self._epoch, batch_size=self._batch, tokens=self._tokens)
        if self._memory is not None:  # what the rank holds as the step ends (zero_grad inside the step: no grads)
            self._memory.finish(self.optimizer, self.step_count, self._segment)
        self.step_count += 1
        self._boundary()  # the next step's start: a switch or a stop lands before the user's next batch

    def _abort(self) -> None:
        """The step raised and the script caught it: the next step starts afresh here, without a boundary
        exchange (only this rank may have failed; every rank must exchange as often as the others)."""
        self._in_step = False
        self._probe.begin()  # the failed step is dropped, never recorded
        self._probe.ready(self.step_count, self._segment, self._segment_start)

    def _boundary(self) -> None:
        self._probe.begin()
        boundary = exchange(self._agent, self._probe, self.step_count)
        if boundary.stop:
            self.stopped = True
            return
        if boundary.decision is not None:
            self._start_segment(boundary.decision)
        self._probe.ready(self.step_count, self._segment, self._segment_start)
        if self._memory is not None:
            self._memory.begin()

    def _first_segment(self, batch_size: int) -> None:
        """Segment 0 at the first step, which gives the batch size; lr is what the optimizer holds now."""
        lr = self.optimizer.param_groups[0].get("lr")
        lr = float(lr) if isinstance(lr, (int, float, torch.Tensor)) and 0 < float(lr) <= 100 else SyncConfig.lr
        first = self.cfg.sync.replace(batch_size=min(batch_size, MAX_BATCH_SIZE), lr=lr)
        self._owned = first  # before the agent's thread can check a request against it
        rank = self._rank
        self._agent = rank.agent = ControlAgent(self.rank, self.world_size, rank.job, rank.connect, rank.emit,
                                                self._check, first, group=rank.group)
        self._start_segment(Decision(0, first, "start"))
        if self.rank == 0:
            rank.emit(RunStarted(model=f"own:{type(self.model).__name__}", dataset="own",
                                 world_size=self.world_size, strategy=first.strategy, bucket_mb=first.bucket_mb,
                                 async_op=first.async_op, batch_size=first.batch_size, lr=first.lr,
                                 **model_layout(self.model), steps_per_epoch=0, t=time.time(),
                                 warmup=metrics.warmup_for(self.cfg.to_dict()),
                                 backend=torch.distributed.get_backend(),
                                 no_eval="the loop is the user's own: ddptop runs no evaluation in it"))

    def _start_segment(self, decision: Decision) -> None:
        """As Trainer.start_segment, for the user's loop: same resync, strategy, fingerprint and event."""
        began = now()
        sync, previous = decision.config, self.sync
        if self.strategy is not None:
            self.strategy.teardown()
        sync_bytes = resync(self.model, self.optimizer, previous, sync, self.world_size)
        if previous is None:
            sync_bytes += self._start_bytes
        self.sync, self._segment, self._segment_start = sync, self._segment + 1, self.step_count
        self.strategy, self.wrapper.inner = build_for(self.model, sync, self.rank, self.world_size, self.device,
                                                      self._probe, find_unused=self.find_unused)
        if self._memory is not None:  # each segment sampled at its first step, as ddptop's own loop does
            self._memory.watch(self.model)
            self._memory.due_now()
        print_ = fingerprint(self.model)
        self._agent.applied(decision, self.step_count, self._segment)
        switch_s = now() - began
        self._probe.aside(switch_s)
        self._rank.emit(ConfigApplied(self.rank, self.step_count, self._segment, sync.to_dict(),
                                      decision.request_id, decision.who, time.time(), fingerprint=print_,
                                      sync_bytes=sync_bytes, switch_s=switch_s))

    def _check(self, sync: SyncConfig) -> None:
        """Rank 0 refuses what the user's loop owns before any rank sees it: a segment that said accum=4 or a
        warm-up would record a run that never happened (the script's loop steps and schedules on its own)."""
        refuse_zero(sync.strategy)
        for name, owner in OWNED_BY_LOOP.items():
            if getattr(sync, name) != getattr(self._owned, name):
                raise UsageError(f"{name} belongs to this loop's own {owner}: ddptop cannot change it "
                                 f"(an own loop takes {', '.join(OWN_SETTINGS[:-1])} and {OWN_SETTINGS[-1]})")

    # -- phases, from hooks ---------------------------------------------------------------------------------
    def _mark(self, phase: str) -> None:
        self._probe.mark_through(phase)

    def _forward_done(self, out: Any) -> None:
        """Backward reaching this output ends the forward phase (the loss included) and starts backward."""
        if not (self._in_step and torch.is_grad_enabled()):
            return
        tensor = _first_tensor(out)
        if tensor is not None and tensor.requires_grad:
            tensor.register_hook(self._backward_began)

    def _backward_began(self, grad):
        self._mark("fwd")
        _engine().queue_callback(lambda: _engine().queue_callback(self._backward_done))  # after DDP's own
        return None

    def _backward_done(self) -> None:
        self._mark("bwd")
        self.strategy.after_backward()
        self.strategy.before_step()
        self._synced = True
        self._mark("sync")

    def _before_optimizer(self, optimizer, args, kwargs) -> None:
        if self._in_step and not self._synced:  # backward did not start from the model's output in this step
            self._backward_done()

    def _after_optimizer(self, optimizer, args, kwargs) -> None:
        if self._in_step:
            self._mark("opt")


class _Step:
    def __init__(self, job: Job, batch_size: int, epoch: int, tokens: int = 0):
        self.job, self.batch_size, self.epoch, self.tokens = job, batch_size, epoch, tokens

    def __enter__(self) -> "_Step":
        self.job._enter(self.batch_size, self.epoch, self.tokens)
        return self

    def __exit__(self, kind, value, tb) -> None:
        if kind is None:
            self.job._exit()
        else:
            self.job._abort()


def _first_tensor(out: Any) -> torch.Tensor | None:
    """The first tensor in a model's output: a tensor, a tuple or list, or a dict (HuggingFace's ModelOutput)."""
    if isinstance(out, torch.Tensor):
        return out
    items = out.values() if isinstance(out, dict) else out if isinstance(out, (tuple, list)) else ()
    return next((t for t in map(_first_tensor, items) if t is not None), None)


def crash_line(exc: BaseException, step: int) -> str:
    """One line for an exception that ended the user's loop: its first sentence, what to do when it is DDP's
    unused-parameter error, and that the recording is whole."""
    text = (str(exc).strip().splitlines() or [""])[0]
    text = text.split(". ")[0].rstrip(".")[:200]
    hint = "; a parameter got no gradient: join(find_unused_parameters=True)" \
        if "find_unused_parameters" in str(exc) else ""
    return (f"the loop raised {type(exc).__name__}{': ' + text if text else ''} in step {step}{hint}; the job is "
            "closed and recorded up to there (DDPTOP_DEBUG=1 shows the traceback)")


def _engine():
    from torch.autograd import Variable

    return Variable._execution_engine


def _one_line_errors() -> None:
    """A DdptopError the user's script does not catch is one line and its exit code (README), never a traceback
    (DDPTOP_DEBUG=1 shows it); any other exception is the user's own and keeps its traceback. Either way the job
    closes first: a peer's failure (a RuntimeError from gloo) becomes PeerLost on the way out."""
    previous = sys.excepthook
    if getattr(previous, "ddptop", False):
        return

    def hook(kind, value, tb):
        job = _joined[0] if _joined else None
        if job is not None and isinstance(value, JobStopped):
            job.finish()  # a stop is a clean end: the run's last record says "stopped"
        elif job is not None and not job._closed and job._stack is not None:
            crashed = not isinstance(value, (DdptopError, KeyboardInterrupt))
            try:
                job._crash(value, tb, crashed)
            except DdptopError as exc:
                kind, value = type(exc), exc
            except Exception:
                pass
            if crashed and not isinstance(value, DdptopError) and not os.environ.get("DDPTOP_DEBUG"):
                say_line(f"ddptop rank {job.rank}: {crash_line(value, job.step_count)}")
                sys.stdout.flush()
                os._exit(1)
        if not isinstance(value, DdptopError) or os.environ.get("DDPTOP_DEBUG"):
            return previous(kind, value, tb)
        where = f"ddptop rank {job.rank}" if job is not None else "ddptop"
        # the process's own stderr: torch.distributed wraps this hook and buffers sys.stderr to prefix "[rankN]:"
        say_line(f"{where}: {value}")
        sys.stdout.flush()
        os._exit(value.exit_code)

    hook.ddptop = True
    sys.excepthook = hook
