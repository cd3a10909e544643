"""Real training through ddptop's front process: the loss of `tiny` falls on the synthetic set."""

from __future__ import annotations

import math

from ddptop.config import RunConfig, SyncConfig
from ddptop.events import EpochDone, RankJoined, RunFinished
from jobs import run_job, steps_of


def test_tiny_loss_falls_clearly_over_200_steps():
    cfg = RunConfig(model="tiny", sync=SyncConfig(strategy="ddp", batch_size=32, lr=0.05), steps=200,
                    synthetic_size=3200, span_every=50, backend="gloo")
    code, events = run_job(cfg)
    assert code == 0
    losses = [d.loss for d in sorted(steps_of(events, 0), key=lambda d: d.step)]
    assert len(losses) == 200 and all(math.isfinite(x) for x in losses)
    first, last = sum(losses[:20]) / 20, sum(losses[-20:]) / 20
    assert last < 0.5 * first, (first, last)
    # 3200 images / 2 ranks / 32 = 50 steps per epoch: 4 evaluations, accuracy far above chance by the end
    evals = [e for e in events if isinstance(e, EpochDone)]
    assert len(evals) == 4 and evals[-1].total == 640 and evals[-1].correct / evals[-1].total > 0.5
    assert {e.rank for e in events if isinstance(e, RankJoined)} == {0, 1}
    assert [e.reason for e in events if isinstance(e, RunFinished)] == ["done", "done"]
