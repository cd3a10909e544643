"""Provides `loss_flag`: whether a loss curve says the model is not learning, with the numbers that say so.

One rule for the screen's notice, the headless lines and the report (issue 26). Cross-entropy over C classes is
ln C (2.30 for 10) for a model that guesses uniformly; a loss well above that is a model that is confidently wrong,
which SGD reaches by overshooting (lr 0.1 with momentum 0.9 on VGG-11 from scratch: 2.56 → 17.2 in 5 steps at
batch 256, measured with the profiles' seed 14 on the synthetic set). The course's own Part 2b log rises
2.49 → 6.43 by step 20 (seed 001): the kind of rise a student must be told about, with numbers.
"""

from __future__ import annotations

import math
import statistics
from typing import Sequence

CLASSES = 10  # every data set ddptop trains (synthetic, CIFAR-10, MNIST) has ten classes
START_STEPS = 3  # the start: the lowest loss of a rank's first 3 steps (a diverging run is already 4× up by its 3rd)
RECENT_STEPS = 5  # compared with the mean of its latest 5 steps, so one bad batch never raises the flag
SETTLE_STEPS = 10  # judged from the 10th step on: the first steps of SGD from scratch may overshoot and recover
RISE = 2.0  # "far above its start": twice it. A learning model's 5-step mean wanders by ~10-20% at batch 64
ABOVE_CHANCE = 1.25  # "above chance": 25% over ln C (2.88 for 10 classes), clear of a near-uniform model's noise


def chance(classes: int = CLASSES) -> float:
    """The cross-entropy of a uniform guess over `classes`: ln C."""
    return math.log(classes)


def loss_flag(first: Sequence[float], recent: Sequence[float], steps: int, classes: int = CLASSES) -> str | None:
    """What is wrong with a loss curve, or None. `first`: the losses of a rank's first START_STEPS steps;
    `recent`: its latest RECENT_STEPS; `steps`: the steps it has trained. A loss that is not finite is flagged at
    once; otherwise from SETTLE_STEPS on, when the recent mean is RISE times the start or ABOVE_CHANCE · ln C."""
    if recent and not all(math.isfinite(x) for x in recent):
        return f"the loss is {next(x for x in recent if not math.isfinite(x))}: the model diverged"
    if steps < SETTLE_STEPS or len(first) < START_STEPS or len(recent) < RECENT_STEPS:
        return None
    start, now = min(first[:START_STEPS]), statistics.fmean(recent[-RECENT_STEPS:])
    if not math.isfinite(start):
        return None
    floor = ABOVE_CHANCE * chance(classes)
    why = []
    if now > RISE * start > 0:
        why.append(f"{now / start:.1f}× its start ({start:.2f}, the lowest of its first {START_STEPS} steps)")
    if now > floor:
        why.append(f"above chance (ln {classes} = {chance(classes):.2f}; flagged over {floor:.2f})")
    if not why:
        return None
    return (f"loss {now:.2f} (mean of the last {RECENT_STEPS} steps) is {' and '.join(why)}: the model is not "
            "learning; lower the learning rate (--lr)")


def first_flag(losses: Sequence[tuple[int, float]], classes: int = CLASSES) -> tuple[int, str] | None:
    """The first step of a loss curve ((step, loss) in step order) at which `loss_flag` speaks, and what it says."""
    values = [loss for _, loss in losses]
    for i in range(len(values)):
        text = loss_flag(values[:START_STEPS], values[max(0, i + 1 - RECENT_STEPS):i + 1], i + 1, classes)
        if text:
            return losses[i][0], text
    return None
