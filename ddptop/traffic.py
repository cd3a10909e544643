"""What the NIC counted against what the sync algorithm should send (ring / gather formulas), per rank."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from ddptop.events import StepDone, SystemSample


@dataclass(frozen=True)
class Traffic:
    rank: int
    iface: str
    window_s: float
    steps: int
    nic_tx: int
    nic_rx: int
    expected_tx: int
    expected_rx: int

    @property
    def tx_error(self) -> float:
        """(NIC − expected) / expected for bytes sent; 0 when nothing was expected."""
        return (self.nic_tx - self.expected_tx) / self.expected_tx if self.expected_tx else 0.0

    def describe(self) -> str:
        return (f"rank {self.rank}: sent {self.nic_tx / 1e6:.1f} MB on {self.iface} (NIC) vs "
                f"{self.expected_tx / 1e6:.1f} MB by the formulas ({self.tx_error:+.0%}) over {self.steps} steps")


def measured_vs_expected(samples: Iterable[SystemSample], steps: Iterable[StepDone]) -> Traffic | None:
    """Compare between the first and last system sample taken while this rank trained.

    Counters are read at sample times, so only the steps that ended between those two samples are counted;
    None when fewer than two samples fall inside training.
    """
    steps = sorted(steps, key=lambda d: d.t)
    if not steps:
        return None
    first, last = steps[0].t, steps[-1].t
    inside = sorted((s for s in samples if first < s.t < last and s.nic() is not None), key=lambda s: s.t)
    if len(inside) < 2:
        return None
    a, b = inside[0], inside[-1]
    counted = [d for d in steps if a.t < d.t <= b.t]
    na, nb = a.nic(), b.nic()
    return Traffic(rank=steps[0].rank, iface=a.job_iface, window_s=b.t - a.t, steps=len(counted),
                   nic_tx=nb.tx_bytes - na.tx_bytes, nic_rx=nb.rx_bytes - na.rx_bytes,
                   expected_tx=sum(d.tx_bytes for d in counted), expected_rx=sum(d.rx_bytes for d in counted))


SHARED_IFACES = ("lo", "lo0")
UNEXPLAINED = 1.5  # NIC bytes above 1.5× the formulas (+ TELEMETRY_BYTES) are someone else's traffic
TELEMETRY_BYTES = 64_000  # per step: ddptop's own telemetry, control broadcast and TCP/IP headers, generously


def not_comparable(iface: str, nic_bytes: float | None, expected_bytes: float) -> str:
    """Why a NIC counter cannot be set against the formulas ('' when it can): a loopback that every process on
    the machine shares, or a counter that moved far more than the job's ranks send."""
    if iface in SHARED_IFACES:
        return f"{iface} is shared by every process on this machine: its counters cannot be split per job"
    if nic_bytes is not None and expected_bytes > 0 and nic_bytes > UNEXPLAINED * expected_bytes + TELEMETRY_BYTES:
        return (f"{iface} counted {nic_bytes / expected_bytes:.1f}× what this job's ranks send: other traffic "
                "shares it")
    return ""
