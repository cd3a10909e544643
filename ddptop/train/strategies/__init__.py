"""The strategy registry: one name, one class, one file each."""

from ddptop.train.strategies.allreduce import AllReduce
from ddptop.train.strategies.base import Strategy
from ddptop.train.strategies.ddp import DDP
from ddptop.train.strategies.fsdp import Zero2, Zero3
from ddptop.train.strategies.gather_scatter import GatherScatter
from ddptop.train.strategies.single import Single
from ddptop.train.strategies.zero1 import Zero1

REGISTRY: dict[str, type[Strategy]] = {cls.name: cls for cls in (Single, GatherScatter, AllReduce, DDP, Zero1, Zero2,
                                                                 Zero3)}


def build_strategy(sync, rank, world_size, comm, device_ids=None) -> Strategy:
    return REGISTRY[sync.strategy](sync, rank, world_size, comm, device_ids)
