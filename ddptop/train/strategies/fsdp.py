"""`zero2` and `zero3`: ZeRO stages 2 and 3 from torch's FSDP2 (`torch.distributed.fsdp.fully_shard`), not
re-implemented.

DeepSpeed's words: stage 2 partitions optimizer state and gradients, stage 3 also the parameters. In FSDP2 every
unit's parameters are sharded (DTensor, dim 0) between steps; forward all-gathers a unit's parameters
((N−1)/N·P_u received per rank), backward reduce-scatters its gradients ((N−1)/N·G_u each way) and each rank steps
only its shard (SGD's momentum: sharded too). `reshard_after_forward` is the difference: zero2 (False) keeps the
gathered parameters from forward to backward, zero3 (True) frees them after forward and all-gathers again in
backward. Per step and rank: zero2 ≈ 2·(N−1)/N·S, zero3 ≈ 3·(N−1)/N·S (gloo: reduce-scatter runs as an
all-reduce, +1·(N−1)/N·S). Each collective is a span of its unit ("all-gather body", "reduce-scatter body"; a
unit's second gather in a step "all-gather body (2)"), timed through FSDP2's own hook for them (`set_custom_all_gather`,
`set_custom_reduce_scatter`: torch's default collectives, stamped before and after), its bytes by the formulas above
for the unit's parameters. On a CPU FSDP2 calls them synchronously on the training thread, so they are exposed
communication (`blocking`: metrics.timeline.breakdown); on a GPU they run on FSDP2's own streams, where forward
prefetch can overlap them with compute. With accum K the first K−1 micro-steps run with
`set_requires_gradient_sync(False)`: no reduce-scatter, gradients accumulate unsharded.

fully_shard changes a module in place and has no undo, so it shards a copy: the plain model stays the home copy
(its parameters' storage released while sharded) and gets the full parameters back (DTensor.full_tensor) at teardown.
"""

from __future__ import annotations

import contextlib
import copy

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, fully_shard
try:  # the collectives FSDP2 runs unless told otherwise; set_custom_all_gather is public, its default is not exported
    from torch.distributed.fsdp._fully_shard._fsdp_collectives import DefaultAllGather, DefaultReduceScatter
except ImportError:  # a torch that moved or lacks them (a private module): the units run untimed, bytes still counted
    DefaultAllGather = DefaultReduceScatter = None
from torch.distributed.tensor import distribute_tensor

from ddptop.errors import UsageError
from ddptop.metrics import wire
from ddptop.train.strategies.base import MOMENTUM, WEIGHT_DECAY, Strategy, momentum_of


def shard_units(model: nn.Module, spec: str) -> list[str]:
    """The qualified names of the modules fully_shard makes units of besides the root, deepest first (a unit inside
    another is sharded first, as fully_shard needs). `spec` "": each top-level block that holds parameters; else
    NAME[,NAME], each a module class name or a qualified module name. UsageError: a name that names no module."""
    modules = dict(model.named_modules())
    if not spec:
        return [name for name, child in model.named_children() if any(True for _ in child.parameters())]
    chosen: set[str] = set()
    for name in spec.split(","):
        hits = {qualified for qualified, module in modules.items()
                if qualified == name or type(module).__name__ == name}
        if not hits:
            blocks = ", ".join(n for n, _ in model.named_children())[:200] or "none"
            classes = ", ".join(sorted({type(m).__name__ for m in modules.values()}))[:200]
            raise UsageError(f"shard unit {name!r} names no module of this model (top-level blocks: {blocks}; "
                             f"classes: {classes})")
        chosen |= hits
    chosen.discard("")  # the root is a unit anyway, the last one
    order = {qualified: index for index, qualified in enumerate(modules)}  # the model's order, not a set's: the
    # same on every rank (str hashes differ between processes)
    return sorted(chosen, key=lambda qualified: (-qualified.count("."), order[qualified]))


class Sharded(Strategy):
    """FSDP2 around a copy of the model; the strategy builds the optimizer over the shards."""

    owns_optimizer = True
    reshard = True

    def prepare(self, model: nn.Module) -> nn.Module:
        super().prepare(model)
        self.units = shard_units(model, self.sync.shard_unit)
        mesh = init_device_mesh(self.named_params[0][1].device.type, (self.world_size,))  # the default group
        self.sharded = copy.deepcopy(model)
        modules = dict(self.sharded.named_modules())
        for name in self.units:
            fully_shard(modules[name], mesh=mesh, reshard_after_forward=self.reshard)
        fully_shard(self.sharded, mesh=mesh, reshard_after_forward=self.reshard)
        self.sharded.set_requires_gradient_sync(True)
        self.shards = dict(self.sharded.named_parameters())
        self._formula = dict(self._unit_bytes())
        self._calls: dict[str, int] = {}
        self._blocking = self.named_params[0][1].device.type == "cpu"
        if self.world_size > 1 and TIMED:
            for name in [*self.units, ""]:
                unit = modules[name]
                unit.set_custom_all_gather(_TimedAllGather(self, name or "root"))
                unit.set_custom_reduce_scatter(_TimedReduceScatter(self, name or "root"))
        with torch.no_grad():
            for param in model.parameters():  # the home copy keeps its tensors, not their storage
                param.grad = None
                param.data = torch.empty(0, dtype=param.dtype, device=param.device)
        self.optimizer = None
        return self.sharded

    def _unit_bytes(self) -> list[tuple[str, int]]:
        """(unit, bytes of the trained parameters it holds directly), for the per-unit formula counts."""
        owner: dict[str, str] = {}
        for unit in [*self.units, ""]:  # deepest first: a parameter belongs to the deepest unit holding it
            prefix = f"{unit}." if unit else ""
            for name, _ in self.named_params:
                if name.startswith(prefix) and name not in owner:
                    owner[name] = unit or "root"
        sizes: dict[str, int] = {}
        for name, param in self.named_params:
            sizes[owner[name]] = sizes.get(owner[name], 0) + param.numel() * param.element_size()
        return [(unit, size) for unit, size in sizes.items() if size]

    def module(self) -> nn.Module:
        return self.sharded

    def trial_module(self) -> nn.Module:
        # FSDP's forward all-gathers: there is no collective-free forward to try a larger batch with
        return self.sharded

    def trial_sync(self) -> None:
        self.after_backward()  # backward reduce-scattered the gradients already

    def micro_step(self, last: bool):
        if last:
            return contextlib.nullcontext()
        return _no_gradient_sync(self.sharded)

    def after_backward(self) -> None:
        self._calls = {}  # the next step's collectives are numbered afresh
        if not TIMED and self.world_size > 1:  # a torch without the hooks: each unit's bytes by the formula, untimed
            at = self.comm.now()
            # every micro-step's forward gathers (zero3: its backward again); one reduce-scatter, after the last
            gathers = (2 if self.reshard else 1) * self.sync.accum
            for unit, size in self._formula.items():
                sent, received = wire.ring_all_gather(size, self.world_size)
                rs_sent, rs_received = wire.reduce_scatter(size, self.world_size, dist.get_backend())
                self.comm.add(f"all-gather ×{gathers} + reduce-scatter {unit} (formula)", at, at,
                              size * (gathers + 1), sent * gathers + rs_sent, received * gathers + rs_received)

    def timed(self, what: str, unit: str, call):
        """Run FSDP2's collective `call()` as a span of `unit` with its bytes by the formulas (`what`: "all-gather" or
        "reduce-scatter"). The start is the rank's arrival (comm.arrive: the straggle test hook sleeps there)."""
        comm = self.comm
        key = f"{what} {unit}"
        count = self._calls[key] = self._calls.get(key, 0) + 1
        name = key if count == 1 else f"{key} ({count})"
        size = self._formula.get(unit, 0)
        if what == "all-gather":
            sent, received = wire.ring_all_gather(size, self.world_size)
        else:
            sent, received = wire.reduce_scatter(size, self.world_size, dist.get_backend())  # gloo: an all-reduce
        start = comm.arrive()
        work = call()
        if work is None:
            comm.add(name, start, comm.now(), size, sent, received, blocking=self._blocking)
            return None
        # an asynchronous one (FSDP2's unshard_async_op): its end is stamped when it completes, as DDP's buckets are
        work.get_future().then(lambda _: comm.add(name, start, comm.now(), size, sent, received))
        return work

    def full_parameters(self):
        return ((name, self.shards[name].full_tensor()) for name, _ in self.model.named_parameters())

    def build_optimizer(self, lr: float, momentum: dict[str, torch.Tensor]) -> torch.optim.Optimizer:
        """SGD over the shards; each rank takes its shard of every momentum buffer (no communication)."""
        params = [self.shards[name] for name, _ in self.named_params]
        self.optimizer = torch.optim.SGD(params, lr=lr, momentum=MOMENTUM, weight_decay=WEIGHT_DECAY)
        with torch.no_grad():
            for name, _ in self.named_params:
                if name in momentum:
                    shard = self.shards[name]
                    local = distribute_tensor(momentum[name], shard.device_mesh, shard.placements,
                                              src_data_rank=None).to_local()
                    buffer = torch.zeros_like(shard)
                    buffer.to_local().copy_(local)
                    self.optimizer.state[shard]["momentum_buffer"] = buffer
        return self.optimizer

    def export_momentum(self) -> dict[str, torch.Tensor]:
        out = {}
        for name, _ in self.named_params:  # the same order on every rank: one all-gather each
            buffer = momentum_of(self.optimizer, self.shards[name])
            if buffer is not None:
                out[name] = buffer.full_tensor()
        return out

    def teardown(self) -> None:
        """The home copy gets the full parameters and the buffers (BatchNorm statistics) back."""
        if self.sharded is None:
            return
        with torch.no_grad():
            for name, param in self.model.named_parameters():
                param.data = self.shards[name].full_tensor().detach().clone()
            home = dict(self.model.named_buffers())
            for name, buffer in self.sharded.named_buffers():
                home[name].copy_(buffer)
        self.sharded = self.shards = self.optimizer = None


@contextlib.contextmanager
def _no_gradient_sync(module):
    module.set_requires_gradient_sync(False)
    try:
        yield
    finally:
        module.set_requires_gradient_sync(True)


TIMED = DefaultAllGather is not None and all(hasattr(FSDPModule, hook) for hook in ("set_custom_all_gather",
                                                                                  "set_custom_reduce_scatter"))


class _TimedAllGather(DefaultAllGather or object):
    """torch's default all-gather for one unit, timed by the strategy (FSDP2's set_custom_all_gather)."""

    def __init__(self, strategy: Sharded, unit: str):
        self.strategy, self.unit = strategy, unit

    def __call__(self, output_tensor, input_tensor, group, async_op=False):
        parent = super().__call__
        return self.strategy.timed("all-gather", self.unit,
                                   lambda: parent(output_tensor, input_tensor, group=group, async_op=async_op))


class _TimedReduceScatter(DefaultReduceScatter or object):
    """torch's default reduce-scatter for one unit, timed by the strategy (FSDP2's set_custom_reduce_scatter)."""

    def __init__(self, strategy: Sharded, unit: str):
        self.strategy, self.unit = strategy, unit

    def __call__(self, output_tensor, input_tensor, group, op, async_op=False):
        parent = super().__call__
        return self.strategy.timed("reduce-scatter", self.unit, lambda: parent(output_tensor, input_tensor,
                                                                               group=group, op=op, async_op=async_op))


class Zero2(Sharded):
    name = "zero2"
    reshard = False


class Zero3(Sharded):
    name = "zero3"
    reshard = True
