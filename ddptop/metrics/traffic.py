"""What the NIC counted against what the sync algorithm should send (ring / gather formulas), per rank."""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Iterable

from ddptop.events import StepDone, SystemSample
from ddptop.metrics import step_start


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


@dataclass(frozen=True)
class StepRun:
    """Consecutive steps of one rank with no NIC reading from the first one's start to the last one's end, as one
    item among `measured_vs_expected`'s steps: a reading never falls in it, so only its end, its step count and
    its bytes matter there (a report of 10^6 steps keeps O(readings) of these, not the steps)."""

    rank: int
    t: float  # the last step's end
    iter_s: float  # from the first step's start
    count: int
    tx_bytes: int
    rx_bytes: int
    aside_s: float = 0.0
    data_s: float = 0.0
    fwd_s: float = 0.0  # no forward mark: `between_steps` never splits inside one
    micro_s: float = 0.0
    bwd_s: float = 0.0


WINDOW_STEPS = 10  # steps a window without clean ends must hold: one step's bytes off at most, 10%


def between_steps(steps: list[StepDone], overlapped: bool = True):
    """A test of times for `steps` (sorted by end): True when a counter read at that time splits the traffic into
    whole steps, i.e. it falls in some step's data loading or forward pass. Every collective of the step before
    has completed (a step ends after its last wait) and this step's have not begun (gradients exist only once the
    backward pass runs), whatever the strategy; where no collective `overlapped` the backward pass (every strategy
    but DDP syncs after it), its backward pass too. Time set aside at the step's start (a pause, a switch, the
    epoch's test: before its forward pass) splits it too: no step's collective is in flight then. A step without a
    forward mark (schema 1 files) has none."""
    starts = [step_start(d) for d in steps]

    def test(t: float) -> bool:
        i = bisect.bisect_right(starts, t) - 1  # the step that had started last by t (steps follow one another)
        if i < 0 or steps[i].fwd_s <= 0:
            return False
        d = steps[i]
        return t - starts[i] <= d.aside_s + d.data_s + d.micro_s + d.fwd_s + (0.0 if overlapped else d.bwd_s)

    return test


def measured_vs_expected(samples: Iterable[SystemSample], steps: Iterable[StepDone | StepRun],
                         overlapped: bool = True) -> Traffic | None:
    """Compare between two system samples taken while this rank trained: the steps that ended between them against
    the bytes its interface counted between them. None when fewer than two samples fall inside training.

    The two samples are ones taken between two steps' traffic (`between_steps`; `overlapped`: False where the
    strategy syncs after the backward pass) where there are: the counters
    between them hold exactly the steps that ended between them, no partial step at either end (with steps of
    seconds and samples every 0.5 s, the first and last sample alone can be off by most of a step's bytes, and a
    NIC quiet for a whole sample period is no such mark: under DDP the backward pass can run for longer than that
    between two buckets of one step). Without two such samples (steps much shorter than the sample period), the
    first and last sample, where they hold at least WINDOW_STEPS steps: the step in flight at each end is counted
    at one end and left out at the other, so the error is at most one step's bytes, 10% over 10 steps.
    """
    steps = sorted(steps, key=lambda d: d.t)
    if not steps:
        return None
    first, last = steps[0].t, steps[-1].t
    inside = sorted((s for s in samples if first <= s.t <= last and s.nic() is not None), key=lambda s: s.t)
    if len(inside) < 2:
        return None
    splits = between_steps(steps, overlapped)
    clean = [s for s in inside if splits(s.t)]
    bounded = len(clean) >= 2 and any(clean[0].t < d.t <= clean[-1].t for d in steps)
    a, b = (clean[0], clean[-1]) if bounded else (inside[0], inside[-1])
    counted = [d for d in steps if a.t < d.t <= b.t]
    n = sum(d.count if isinstance(d, StepRun) else 1 for d in counted)
    if not bounded and n < WINDOW_STEPS:
        return None
    na, nb = a.nic(), b.nic()
    return Traffic(rank=steps[0].rank, iface=a.job_iface, window_s=b.t - a.t, steps=n,
                   nic_tx=nb.tx_bytes - na.tx_bytes, nic_rx=nb.rx_bytes - na.rx_bytes,
                   expected_tx=sum(d.tx_bytes for d in counted), expected_rx=sum(d.rx_bytes for d in counted))


SHARED_IFACES = ("lo", "lo0")
UNEXPLAINED = 1.5  # NIC bytes above 1.5× the formulas (+ TELEMETRY_BYTES) are someone else's traffic
TELEMETRY_BYTES = 64_000  # per step: ddptop's own telemetry, control broadcast and TCP/IP headers, generously


def not_comparable(iface: str, nic_bytes: float | None, expected_bytes: float, steps: int = 1) -> str:
    """Why a NIC counter cannot be set against the formulas ('' when it can): a loopback that every process on
    the machine shares, or a counter that moved far more than the job's ranks send. The bytes are those of
    `steps` steps (1: per step), each with its own TELEMETRY_BYTES."""
    if iface in SHARED_IFACES:
        return f"{iface} is shared by every process on this machine: its counters cannot be split per job"
    allowed = UNEXPLAINED * expected_bytes + TELEMETRY_BYTES * max(1, steps)
    if nic_bytes is not None and expected_bytes > 0 and nic_bytes > allowed:
        return (f"{iface} counted {nic_bytes / expected_bytes:.1f}× what this job's ranks send: other traffic "
                "shares it")
    return ""
