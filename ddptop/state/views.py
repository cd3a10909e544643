"""Provides the frozen views a snapshot is made of: ranks, segments, eval points, nodes and their NICs."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from ddptop.metrics.energy import RankEnergy
from ddptop.metrics.tables import describe
from ddptop.events import NicStat, StepDone, StepSpans, SystemSample


@dataclass(frozen=True)
class RankView:
    """One rank as the ranks table shows it."""

    rank: int
    host: str = "?"
    device: str = "?"
    rank_source: str = "?"
    state: str = "starting"  # starting, running, paused, lost, done, stopped, error
    last: StepDone | None = None
    system: SystemSample | None = None
    slowest: bool = False  # the largest iteration time among running ranks (with 2 or more)
    energy: RankEnergy | None = None  # joules per step and sample since the first GPU reading (metrics.energy)

    @property
    def step(self) -> int:
        """Steps this rank has finished (0 before the first)."""
        return self.last.step + 1 if self.last else 0

    @property
    def gpu_percent(self) -> float | None:
        gpus = self.system.gpus if self.system else ()
        values = [g.util_percent for g in gpus if g.util_percent is not None]
        return sum(values) / len(values) if values else None


@dataclass(frozen=True)
class Segment:
    """A stretch of steps under one configuration (rank 0's ConfigApplied)."""

    index: int
    step: int
    config: Mapping
    who: str
    t: float

    def label(self) -> str:
        """The config as every table and line says it (metrics.tables.describe)."""
        return describe(self.config)


@dataclass(frozen=True)
class EvalPoint:
    """Test-set result at an epoch's end, summed over the ranks that reported it."""

    epoch: int
    step: int
    test_loss: float
    correct: int
    total: int

    @property
    def accuracy(self) -> float:
        return self.correct / self.total if self.total else 0.0


@dataclass(frozen=True)
class NicView:
    """One interface of one node: the latest counters and short rate histories (bytes/s)."""

    stat: NicStat
    rx_history: tuple[float, ...] = ()
    tx_history: tuple[float, ...] = ()
    per_step_tx: float | None = None  # NIC bytes per training step, from counter deltas / steps between samples
    per_step_rx: float | None = None


@dataclass(frozen=True)
class NodeView:
    """One machine: the rank that reports it, its job interface, and every interface it has."""

    host: str
    rank: int
    ranks: tuple[int, ...]
    job_iface: str
    nics: Mapping[str, NicView] = field(default_factory=dict)
    expected_tx: int = 0  # bytes per step the strategy should send from this node's ranks (wire formulas)
    expected_rx: int = 0

    def nic(self, iface: str | None = None) -> NicView | None:
        return self.nics.get(iface or self.job_iface)


@dataclass(frozen=True)
class UtilView:
    """CPU, memory and GPU histories of one rank (its first GPU; 0 where NVML gave no reading). Units: %, bytes,
    W, °C, MHz, bytes/s."""

    rank: int
    cpu: tuple[float, ...] = ()
    rss: tuple[float, ...] = ()
    gpu: tuple[float, ...] = ()
    gpu_mem: tuple[float, ...] = ()  # the whole GPU
    power: tuple[float, ...] = ()
    proc_gpu_mem: tuple[float, ...] = ()  # this rank's process
    temp: tuple[float, ...] = ()
    sm_clock: tuple[float, ...] = ()
    pcie_rx: tuple[float, ...] = ()
    pcie_tx: tuple[float, ...] = ()
    nvlink_rx: tuple[float, ...] = ()
    nvlink_tx: tuple[float, ...] = ()


@dataclass(frozen=True)
class SpanStore:
    """Recent sampled steps: (rank, step) → StepSpans."""

    by_key: Mapping[tuple[int, int], StepSpans] = field(default_factory=dict)

    def steps(self, rank: int) -> list[int]:
        return sorted(step for r, step in self.by_key if r == rank)

    def get(self, rank: int, step: int) -> StepSpans | None:
        return self.by_key.get((rank, step))
