"""The strategy registry: one name, one class, one file each."""

from ddptop.train.strategies.allreduce import AllReduce
from ddptop.train.strategies.base import Strategy
from ddptop.train.strategies.ddp import DDP
from ddptop.train.strategies.gather_scatter import GatherScatter
from ddptop.train.strategies.single import Single

REGISTRY: dict[str, type[Strategy]] = {cls.name: cls for cls in (Single, GatherScatter, AllReduce, DDP)}


def build_strategy(sync, rank, world_size, comm, device_ids=None) -> Strategy:
    return REGISTRY[sync.strategy](sync, rank, world_size, comm, device_ids)
