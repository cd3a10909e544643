"""Issue 26 items 1 and 7: a loss that rises far above its start or above chance is flagged (one rule, said on the
screen's notices and in the headless lines); a headless line's figures come from one segment and say whose they are."""

from __future__ import annotations

import io
import math

from ddptop.events import ConfigApplied, StepDone
from ddptop.front.headless import HeadlessPrinter
from ddptop.metrics.learning import first_flag, loss_flag
from ddptop.state.session import SessionState

# lr 0.1, momentum 0.9, VGG-11 from scratch, batch 256, seed 14 on the synthetic set: its first 12 losses, step by
# step (the run of benchmarks/synthetic_difficulty.py --model vgg11 --momentum 0.9 --batch-size 256 --seed 14 --lr 0.1,
# whose first 10 average 10.58), as profiles/cs744-*.toml trained before issue 26
DIVERGING = [2.56, 5.08, 9.94, 16.19, 17.17, 14.98, 12.98, 10.74, 8.83, 7.33, 4.01, 5.12]
LEARNING = [2.46, 2.41, 2.52, 2.38, 2.35, 2.30, 2.28, 2.33, 2.25, 2.21, 2.24, 2.18]  # near chance, falling


def test_the_rule_flags_a_rise_and_a_loss_above_chance_with_the_numbers():
    assert first_flag(list(enumerate(LEARNING))) is None
    step, text = first_flag(list(enumerate(DIVERGING)))
    assert step == 9  # the 10th step: the first the rule judges
    assert "loss 10.97 (mean of the last 5 steps) is 4.3× its start (2.56" in text  # steps 5-9: 14.98 … 7.33
    assert "above chance (ln 10 = 2.30" in text and "--lr" in text
    # above chance from a start already high (no rise): 3.0 everywhere is 1.3 · ln 10
    assert "above chance" in loss_flag([3.0] * 5, [3.0] * 5, 10) and "its start" not in loss_flag([3.0] * 5, [3.0] * 5, 10)
    # a rise from a low start that stays under chance: 0.5 → 1.2 is 2.4× its start
    assert "2.4× its start (0.50" in loss_flag([0.5, 0.6, 0.7], [1.2] * 5, 40)
    assert loss_flag([2.3] * 5, [2.8] * 5, 40) is None  # 1.22 · ln 10: within the margin
    assert loss_flag([0.5] * 5, [20.0] * 5, 9) is None  # before the 10th step nothing is judged
    assert "nan" in loss_flag([2.3] * 2, [2.3, math.nan], 2)  # a NaN at once


def _step(rank, step, loss, segment=0, iter_s=1.0, tx=0, batch=64):
    return StepDone(rank, step, 0, segment, float(step), iter_s, 0.0, iter_s, 0.0, 0.0, 0.0, batch, loss, tx, tx, tx,
                    False)


def test_the_state_says_the_flag_once_and_the_headless_lines_print_it():
    state = SessionState()
    state.apply_all([_step(0, s, loss) for s, loss in enumerate(DIVERGING)])
    flagged = [n for n in state.notices if n.startswith("WARNING: step 10: rank 0's loss")]
    assert len(flagged) == 1 and "above chance" in flagged[0]
    out = io.StringIO()
    HeadlessPrinter(total_steps=12, every=100, out=out, bar=False).handle(
        [_step(r, s, loss) for s, loss in enumerate(DIVERGING) for r in (1, 0)])
    warnings = [line for line in out.getvalue().splitlines() if line.startswith("WARNING")]
    assert len(warnings) == 1 and "step 10: rank 1's loss 10.97" in warnings[0]


def test_a_headless_line_counts_only_its_own_segment_and_names_whose_figures_they_are():
    """Segment 0: single, 2 s steps, nothing sent; segment 1 from step 6: ring, 0.5 s steps, 9 MB per step. The line
    at step 10 (every 10) must read segment 1's steps 7-9 (its step 6 is a warm-up step), not a blend."""
    switch = [ConfigApplied(r, 6, 1, {"strategy": "allreduce"}, 1, "ctl", 6.0) for r in (0, 1)]
    steps = [_step(r, s, 2.3, iter_s=2.0) for s in range(6) for r in (1, 0)]
    steps += [_step(r, s, 2.3, segment=1, iter_s=0.5 if r == 0 else 0.8, tx=9_000_000) for s in range(6, 10)
              for r in (1, 0)]
    out = io.StringIO()
    printer = HeadlessPrinter(total_steps=10, every=10, out=out, bar=False)
    printer.handle(steps[:12])
    printer.handle(switch + steps[12:])
    line = out.getvalue().splitlines()[-1]
    # job: the slowest rank's 0.8 s steps; every rank's 3 × 64 images over its 2.4 s; rank 0's 9 MB per step
    assert line.startswith("step 10/10 loss 2.3000 (rank 0) | job: 0.800 s/it 160 img/s (segment 1, 2 ranks)"), line
    assert "rank 0: comm 0% overlap 0% exposed 0 ms sent 9.0 MB/step" in line, line
