"""Provides each rank's energy: joules per step and per sample, and the joules its exposed communication spent
waiting, from NVML's total-energy counter (GpuStat.energy_j) or, where a GPU has none, power × time (said so).

One meter per rank, fed the rank's StepDone and SystemSample events in the order the front received them (the
recording's `seq`, so the screen, `info` and the report count alike): the energy between two counter readings
belongs to the steps received between them. The sampler reads the counter every 0.5 s (sources/sampler.py), the
period stated beside each figure: a figure is a mean over the steps of at least one period, and steps still in
flight at the window's two ends shift it by at most one publisher batch over the whole window.

The communication's share is the window's mean power × the steps' exposed communication, not the counter's delta
over the communication's windows: a counter read every 0.5 s (NVML states no update period for it) cannot resolve
the few milliseconds a step waits. It is an upper bound: a GPU waiting on a transfer draws less than one computing.
"""

from __future__ import annotations

from dataclasses import dataclass

COUNTER = "NVML energy counter"
POWER_TIME = "power × time (no energy counter on this GPU)"


@dataclass(frozen=True)
class RankEnergy:
    """One rank's energy over its window of steps."""

    rank: int
    steps: int  # steps the window holds
    j_per_step: float
    j_per_sample: float
    comm_j_per_step: float  # mean power × exposed communication per step: an upper bound (module docstring)
    watts: float  # the window's mean power
    source: str  # COUNTER or POWER_TIME
    period_s: float  # mean time between two readings the figures rest on (0: one reading)

    def line(self) -> str:
        """The figures in words, as `info`, the report and the Ranks panel say them."""
        return (f"{self.j_per_step:.3g} J/step, {self.j_per_sample:.3g} J/sample, waiting in communication "
                f"{self.comm_j_per_step:.3g} J/step ({self.watts:.0f} W; {self.source}, read every "
                f"{self.period_s:.2g} s)")


@dataclass
class _Mark:
    t: float
    joules: float
    steps: int
    samples: int
    exposed_s: float


class EnergyMeter:
    """Feeds: `step` (StepDone) and `sample` (SystemSample) of one rank; `figures()` the RankEnergy or None."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.steps = self.samples = 0
        self.exposed_s = self.time_s = 0.0
        self.first: _Mark | None = None
        self.last: _Mark | None = None
        self.readings = 0  # counter readings since `first`
        self.watts: list[float] = []  # power readings, for a GPU without the counter
        self.watt_steps = 0  # steps counted since the first power reading
        self.watt_samples = 0
        self.watt_exposed_s = self.watt_time_s = 0.0
        self.status = ""  # why there is no figure: the sample's gpu_status where it has no GPU

    def step(self, e) -> None:
        self.steps += 1
        self.samples += int(e.batch_size)
        self.exposed_s += float(e.exposed_comm_s)
        self.time_s += float(e.iter_s)
        if self.watts:
            self.watt_steps += 1
            self.watt_samples += int(e.batch_size)
            self.watt_exposed_s += float(e.exposed_comm_s)
            self.watt_time_s += float(e.iter_s)

    def sample(self, e) -> None:
        if not e.gpus:
            self.status = e.gpu_status
            return
        joules = [g.energy_j for g in e.gpus]
        if all(j is not None for j in joules):
            mark = _Mark(float(e.t), float(sum(joules)), self.steps, self.samples, self.exposed_s)
            if self.last is not None and (mark.joules < self.last.joules or mark.t <= self.last.t):
                self.first, self.readings = None, 0  # the counter restarted (driver reload) or a clock step
            if self.first is None:
                self.first = mark
            self.last = mark
            self.readings += 1
            return
        watts = [g.power_w for g in e.gpus]
        if all(w is not None for w in watts):
            self.watts.append(float(sum(watts)))
        else:
            self.status = "the GPU reports neither an energy counter nor power"

    def figures(self) -> RankEnergy | None:
        a, b = self.first, self.last
        if a is not None and b is not None and b.steps > a.steps and b.t > a.t:
            joules, steps = b.joules - a.joules, b.steps - a.steps
            watts = joules / (b.t - a.t)
            return RankEnergy(self.rank, steps, joules / steps, joules / max(1, b.samples - a.samples),
                              watts * (b.exposed_s - a.exposed_s) / steps, watts, COUNTER,
                              (b.t - a.t) / (self.readings - 1))
        if self.watts and self.watt_steps:
            watts = sum(self.watts) / len(self.watts)
            joules = watts * self.watt_time_s
            return RankEnergy(self.rank, self.watt_steps, joules / self.watt_steps,
                              joules / max(1, self.watt_samples), watts * self.watt_exposed_s / self.watt_steps,
                              watts, POWER_TIME, 0.0)
        return None


def lines(found: dict[int, RankEnergy], why: str, indent: str = "  ") -> list[str]:
    """`info`'s and the report's words: one line per rank, or why there are none (said once, never zeros)."""
    if not found:
        return [f"none measured: {why}"]
    return [f"{indent}rank {r}: {found[r].line()}" for r in sorted(found)]


def energies(events) -> tuple[dict[int, RankEnergy], str]:
    """Every rank's RankEnergy from StepDone and SystemSample events in the order received, and why there is none
    where no rank has one ("" where some have)."""
    meters: dict[int, EnergyMeter] = {}
    for e in events:
        meter = meters.setdefault(e.rank, EnergyMeter(e.rank))
        if e.kind == "step_done":
            meter.step(e)
        elif e.kind == "system_sample":
            meter.sample(e)
    found = {r: f for r, m in meters.items() if (f := m.figures()) is not None}
    why = "" if found else next((m.status for m in meters.values() if m.status), "no GPU samples")
    return found, why
