"""Provides the pure half of `tune bucket` and `tune strategy`: which bucket sizes to try (the what-if rows predicted
fastest) or which strategies, the steps each trial is measured over, its measurement (the slowest rank's mean step:
ddptop.metrics' one definition), a strategy trial's memory per rank (metrics.memory) and the configuration kept."""

from __future__ import annotations

import math
from typing import Any, Iterable, Mapping, Sequence

from ddptop.events import StepDone, TuneTrial
from ddptop.metrics import job_figures, window

MAX_TRIALS = 5  # each trial is a live segment of the user's job: five already cost ~5 × (STEPS + 4) steps
TRIALS = 3  # the model's best three other sizes: its error (README: median ≤ 10.6%) can reorder close neighbours
STEPS = 20  # steps measured per trial after its warm-up: 20 tiny-model steps vary ~5% under a load of 4 here
# A trial replaces the size in force only when faster by more than the noise of the two measurements: NOISE_Z
# standard errors of the difference (each mean's own steps' spread / √n; 2: about 2.5% of equal sizes would pass on
# noise alone), and never by less than MIN_GAIN of the step. A switch on noise is a change the user did not gain
# from: VGG-11 on 2 local ranks here measured 25, 10, 5 and 1 MB at 214.8, 217.6, 216.0, 214.1 ms, and 1 MB had
# "won" by 0.3%. The margin follows the machine: a quiet one keeps a 2% gain, a loaded one (20 tiny-model steps
# vary ~5% under a load of 4) asks for more.
MIN_GAIN = 0.01
NOISE_Z = 2.0
BUCKETED = ("ddp", "zero1")  # zero1 is DDP's bucketed all-reduce (plus a sharded optimizer): its buckets tune alike
STRATEGIES = ("ddp", "zero1", "zero2", "zero3")  # what `tune strategy` tries: replicated against ZeRO-1/2/3
# the keys a trial may change from the start's configuration: its own, and what a strategy switch turns off on the
# way (config.SyncConfig.changed: async_op leaving allreduce, a compression the new strategy cannot carry)
VARIES = {"bucket": ("bucket_mb",), "strategy": ("strategy", "async_op", "compress")}


def strategies(current: str) -> list[str]:
    """The strategies a strategy tune tries from `current`: each of STRATEGIES but the one in force."""
    return [s for s in STRATEGIES if s != current]


def memory(rows: Iterable[Any], segment: int, world_size: int) -> tuple[int, int] | None:
    """(held, peak) of `segment` from metrics.memory's RankMemory rows: the most any rank holds (parameters, gradients
    and optimizer state) and the largest peak; None until every one of `world_size` ranks has a sample of it."""
    mine = [r for r in rows if r.segment == segment]
    if len({r.rank for r in mine}) < world_size:
        return None
    return max(r.held_bytes for r in mine), max(r.peak_bytes for r in mine)


def candidates(rows: Sequence[Mapping[str, Any]], world_size: int, current_mb: float, trials: int = TRIALS
               ) -> list[float]:
    """The `trials` (at most MAX_TRIALS) DDP bucket sizes predicted fastest on the run's own world size and link,
    ties by size; the size in force is left out (the starting segment measures it)."""
    ddp = sorted((r for r in _ddp_rows(rows, world_size)
                  if float(r["bucket_mb"]) != float(current_mb) and r["step_s"] is not None),
                 key=lambda r: (r["step_s"], r["bucket_mb"]))
    out: list[float] = []
    for r in ddp:
        if float(r["bucket_mb"]) not in out:
            out.append(float(r["bucket_mb"]))
    return out[:max(0, min(trials, MAX_TRIALS))]


def ddp_sizes(rows: Sequence[Mapping[str, Any]], world_size: int) -> list[float]:
    """Every DDP bucket size the what-if rows hold on the run's own world size and link, smallest first."""
    return sorted({float(r["bucket_mb"]) for r in _ddp_rows(rows, world_size)})


def _ddp_rows(rows: Sequence[Mapping[str, Any]], world_size: int) -> Iterable[Mapping[str, Any]]:
    """The what-if rows of DDP with a bucket size, on the run's own world size and link."""
    return (r for r in rows if r["strategy"] == "ddp" and r["bucket_mb"] is not None
            and r["world_size"] == world_size and r["link"] is None)


def next_size(sizes: Sequence[float], measured: Mapping[float, float]) -> float | None:
    """After the predicted trials, what the measurements ask for: when the fastest size measured so far (the start
    among them) is the smallest measured and a smaller size of `sizes` is left, the nearest smaller; the largest
    and a larger one left, the nearest larger; else None. The model's error can rank sizes on one side of the best
    wrongly (a lab job at 1 Gbit/s: 10, 50 and 100 MB tried from 25 MB, 10 MB the fastest of them, while 5 and 1 MB,
    never tried, were faster still): the measurements then walk on toward the side that was faster."""
    if not measured:
        return None
    fastest = min(measured, key=lambda mb: (measured[mb], mb))
    smaller = [mb for mb in sizes if mb < fastest and mb not in measured]
    larger = [mb for mb in sizes if mb > fastest and mb not in measured]
    if fastest == min(measured) and smaller:
        return max(smaller)
    if fastest == max(measured) and larger:
        return min(larger)
    return None


def foreign(segments: Iterable[Any], since: int, tuner: str, base: Mapping[str, Any], what: str = "bucket"
            ) -> Any | None:
    """The first segment after `since` (the start's) that is not one of the tune's own trials, else None. Each of
    `segments` has `index`, `who` and `config` (state.views.Segment). A trial is asked by `tuner` and runs `base`
    (the start's configuration) but for what `what` varies (VARIES); anything else is another client's `set`: one
    that landed between two trials (the next trial's request then carries its change), or during one, or that a
    pause merged with the tuner's. A trial measured after it would measure another configuration under a trial's
    label."""
    def rest(config: Mapping[str, Any]) -> dict:
        return {k: v for k, v in config.items() if k not in VARIES[what]}

    return next((s for s in segments if s.index > since and (s.who != tuner or rest(s.config) != rest(base))), None)


def trial_steps(first_step: int, warmup: int, steps: int = STEPS) -> tuple[int, int]:
    """(first, last) step a trial segment that began at `first_step` is measured over: the first `steps` after its
    warm-up, a fixed window, so the measurement does not depend on when the tuner looked."""
    first = first_step + warmup
    return first, first + steps - 1


def start_steps(history: Mapping[int, Iterable[StepDone]], segment: int, first_step: int, warmup: int,
                steps: int = STEPS) -> tuple[int, int] | None:
    """(first, last): the newest `steps` steps after warm-up of `segment` that every rank reported; None until
    there are that many."""
    newest = [max((d.step for d in h if d.segment == segment), default=-1) for h in history.values()]
    if not newest:
        return None
    last = min(newest)
    first = max(first_step + warmup, last - steps + 1)
    return (first, last) if last - first + 1 >= steps else None


def measure(history: Mapping[int, Iterable[StepDone]], world_size: int, segment: int, first: int, last: int
            ) -> float | None:
    """The slowest rank's mean step time over steps first..last of `segment` (sampled steps left out, as
    metrics.window does); None until each of `world_size` ranks reported every one of them."""
    found = measured(history, world_size, segment, first, last)
    return None if found is None else found[0]


def measured(history: Mapping[int, Iterable[StepDone]], world_size: int, segment: int, first: int, last: int
             ) -> tuple[float, float] | None:
    """(measure's mean, its standard error: that slowest rank's step times' standard deviation / √n, 0 with one
    step, metrics.Figures.step_se_s); None as measure."""
    if len(history) < world_size:
        return None
    per_rank = []
    for steps in history.values():
        chosen = [d for d in steps if d.segment == segment and first <= d.step <= last]
        if len({d.step for d in chosen}) < last - first + 1:
            return None
        per_rank.append(window(chosen))
    slowest = job_figures(per_rank)
    return slowest.step_s, slowest.step_se_s


def margin(start: TuneTrial, trial: TuneTrial, min_gain: float = MIN_GAIN) -> float:
    """How much faster than the start a trial must be to replace it (s/step): NOISE_Z standard errors of the
    difference of the two means, at least min_gain of the start's step."""
    return max(min_gain * start.step_s, NOISE_Z * math.hypot(start.step_se_s, trial.step_se_s))


def kept(start: TuneTrial, trials: Sequence[TuneTrial], min_gain: float = MIN_GAIN) -> TuneTrial:
    """The fastest trial when it beats the start by more than the margin; else the start (a tie between trials
    keeps the earlier)."""
    best = min(trials, key=lambda t: t.step_s, default=start)
    return best if start.step_s - best.step_s > margin(start, best, min_gain) else start
