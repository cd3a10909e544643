"""Each rank's memory by kind (issue 43): the parameters, gradients and optimizer state it holds in its own storage,
and the device's peak, measured at a step's end on a cadence and emitted as a MemorySample."""

from __future__ import annotations

import time
from typing import Any, Callable, Iterable

import torch
from torch import nn

from ddptop.events import MemorySample
from ddptop.probes.own import OwnTime, now
from ddptop.probes.tensors import leaves

EVERY_S = 5.0  # one sample every 5 s at most: a CPU sample's read of the unique memory took 32-52 ms here (a rank of
#               the wide MLP, 290 MB unique, 2 busy cores; sources.memory): under 1% of the training thread


def local(tensor: torch.Tensor) -> torch.Tensor:
    """The part of `tensor` this rank stores: a DTensor's local shard (FSDP2's fully_shard), else the tensor."""
    inner = getattr(tensor, "_local_tensor", None)  # DTensor.to_local() without autograd's wrapper
    return inner if isinstance(inner, torch.Tensor) else tensor


class _Storages:
    """Bytes of distinct storages: a tied weight, a view or a flat buffer's pieces count once (by storage, whole)."""

    def __init__(self) -> None:
        self.seen: set[tuple[str, int]] = set()

    def bytes(self, tensors: Iterable[torch.Tensor]) -> int:
        total = 0
        for tensor in tensors:
            tensor = local(tensor)
            if tensor.device.type == "meta":
                continue
            storage = tensor.untyped_storage()
            key = (str(tensor.device), storage.data_ptr())
            if storage.nbytes() and key not in self.seen:
                self.seen.add(key)
                total += storage.nbytes()
        return total


def optimizer_states(optimizer: Any) -> list[dict]:
    """The state dicts an optimizer keeps: its own, and the local optimizer a ZeroRedundancyOptimizer wraps (which
    holds this rank's shard only)."""
    found, seen = [], set()
    while optimizer is not None and id(optimizer) not in seen:
        seen.add(id(optimizer))
        state = getattr(optimizer, "state", None)
        if isinstance(state, dict):
            found.append(state)
        optimizer = getattr(optimizer, "optim", None)
    return found


def held_bytes(model: nn.Module | list, optimizer: Any) -> tuple[int, int, int]:
    """(parameters, gradients, optimizer state): bytes of this rank's own storage of each, every storage counted once
    and under the first kind it is met in (parameters first). The model's parameters (or their list) as the strategy
    left them: a sharded one's DTensors count their local shard, a wrapper's (DDP) are the model's own."""
    storages = _Storages()
    params = list(model.parameters()) if isinstance(model, nn.Module) else model
    param_bytes = storages.bytes(params)
    grad_bytes = storages.bytes(p.grad for p in params if p.grad is not None)
    states = [value for state in optimizer_states(optimizer) for value in state.values()]
    optim_bytes = storages.bytes(t for value in states for t in leaves(value))
    return param_bytes, grad_bytes, optim_bytes


class MemoryProbe:
    """At a step's end, at its segment's first step and then at most every `every_s` seconds: what the rank holds and
    the device's memory, as a MemorySample. On CUDA the allocator's statistics (the peak reset at each sample); on
    CPU the process's unique memory at the step's end (once: a read costs tens of ms, sources.memory), its largest
    over a segment being the segment's peak (metrics.memory). Its time goes to ddptop's own cost and to cost_s."""

    def __init__(self, rank: int, device: torch.device, emit: Callable[[Any], None], own: OwnTime, unique: Any,
                 every_s: float = EVERY_S, clock: Callable[[], float] = time.monotonic) -> None:
        """`unique`: the process's unique memory on a CPU (sources.memory.UniqueMemory: `read()` and `by`)."""
        self.rank, self.device, self.emit, self.own = rank, device, emit, own
        self.every_s, self.clock = every_s, clock
        self.cuda = device.type == "cuda"
        self.uss = unique
        self._due = 0.0  # the clock's time from which the next step is sampled
        self._armed = False  # the step under way is a sampled one
        self._params: list = []  # the segment's parameters, listed once (walking the model each sample is a cost)

    def watch(self, model: nn.Module) -> None:
        """A segment starts: its strategy has built its parameters (FSDP2: the sharded ones, kept between steps)."""
        self._params = list(model.parameters())

    def due_now(self) -> None:
        """Sample the next step whatever the cadence says (a segment's first: its strategy's state)."""
        self._due = 0.0

    def begin(self) -> None:
        """A step starts: it is a sampled one when the cadence says so."""
        self._armed = self.clock() >= self._due

    def finish(self, optimizer: Any, step: int, segment: int) -> None:
        """The step ended: on a sampled step, measure and emit."""
        if not self._armed:
            return
        began = now()
        self._armed = False
        self._due = self.clock() + self.every_s
        params, grads, optim = held_bytes(self._params, optimizer)
        if self.cuda:
            index = self.device.index
            peak = torch.cuda.max_memory_allocated(index)
            current, reserved = torch.cuda.memory_allocated(index), torch.cuda.memory_reserved(index)
            by = "cuda allocator"
            torch.cuda.reset_peak_memory_stats(index)
        else:
            current, reserved, by = self.uss.read(), 0, self.uss.by
            peak = current
        cost = now() - began
        self.own.add(cost)
        self.emit(MemorySample(self.rank, step, segment, time.time(), params, grads, optim, peak, current, reserved,
                               by, cost_s=cost))
