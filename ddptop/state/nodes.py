"""Provides NodeTracker: per machine and interface, NIC rate histories and bytes per step, one reporter per host."""

from __future__ import annotations

import collections
from dataclasses import dataclass, field
from typing import Callable

from ddptop.events import NicStat, SystemSample
from ddptop.state.views import NicView, NodeView

NIC_HISTORY = 300  # samples per interface (150 s at the sampler's 0.5 s): wider than any graph


@dataclass
class _Nic:
    stat: NicStat
    rx: collections.deque = field(default_factory=lambda: collections.deque(maxlen=NIC_HISTORY))
    tx: collections.deque = field(default_factory=lambda: collections.deque(maxlen=NIC_HISTORY))
    base: tuple[int, int, int] | None = None  # (step, tx_bytes, rx_bytes) at the last sample with a new step
    per_step: tuple[float, float] | None = None


@dataclass
class _Node:
    host: str
    ranks: set[int]
    job_iface: str = ""
    nics: dict[str, _Nic] = field(default_factory=dict)


class NodeTracker:
    """Ranks on one host all read the same NICs: only the host's lowest rank feeds its histories."""

    def __init__(self) -> None:
        self.nodes: dict[str, _Node] = {}

    def join(self, host: str, rank: int) -> None:
        self.nodes.setdefault(host, _Node(host, set())).ranks.add(rank)

    def sample(self, e: SystemSample, step: int) -> None:
        self.join(e.host, e.rank)
        node = self.nodes[e.host]
        if e.rank != min(node.ranks):
            return
        node.job_iface = e.job_iface
        for stat in e.nics:
            nic = node.nics.get(stat.iface) or node.nics.setdefault(stat.iface, _Nic(stat))
            nic.stat = stat
            nic.rx.append(stat.rx_rate)
            nic.tx.append(stat.tx_rate)
            if nic.base is not None and step > nic.base[0]:
                steps = step - nic.base[0]
                nic.per_step = ((stat.tx_bytes - nic.base[1]) / steps, (stat.rx_bytes - nic.base[2]) / steps)
            if nic.base is None or step > nic.base[0]:
                nic.base = (step, stat.tx_bytes, stat.rx_bytes)

    def views(self, expected: Callable[[int], tuple[int, int]]) -> tuple[NodeView, ...]:
        out = []
        for node in self.nodes.values():
            per_rank = [expected(r) for r in sorted(node.ranks)]
            nics = {name: NicView(n.stat, tuple(n.rx), tuple(n.tx), *(n.per_step or (None, None)))
                    for name, n in node.nics.items()}
            out.append(NodeView(node.host, min(node.ranks), tuple(sorted(node.ranks)), node.job_iface, nics,
                                sum(tx for tx, _ in per_rank), sum(rx for _, rx in per_rank)))
        return tuple(sorted(out, key=lambda v: v.rank))
