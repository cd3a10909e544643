"""A run that evaluates no test accuracy says why in the Loss panel (issue 44: a custom loss left it at "no
evaluation yet" for the whole run). A real 2-rank job with the README's own model, data set and loss
(ddptop/examples/my_model.py), recorded, then replayed into the screen."""

from __future__ import annotations

import subprocess
import sys

import pytest

from ddptop.front.pipeline import compose
from ddptop.record.replay import ReplaySource
from ddptop.tui.app import DdptopApp
from screen_text import drawn_text

pytestmark = pytest.mark.asyncio
EXAMPLE = "ddptop.examples.my_model"


async def test_a_custom_loss_says_there_is_no_accuracy_and_why(tmp_path):
    record = tmp_path / "own-loss.db"
    run = subprocess.run([sys.executable, "-m", "ddptop", "--headless", "--local", "2", "--backend", "gloo",
                          "--model", f"{EXAMPLE}:model", "--dataset", f"{EXAMPLE}:data", "--loss", f"{EXAMPLE}:loss",
                          "--synthetic-size", "256", "--batch-size", "16", "--steps", "6", "--record", str(record)],
                         capture_output=True, text=True, timeout=180)
    assert run.returncode == 0, run.stderr
    source = ReplaySource(str(record), speed=16.0, playing=False)
    source.seek_time(source.t_end)
    app = DdptopApp(compose(source))
    try:
        async with app.run_test(size=(160, 48)) as pilot:
            await pilot.press("6")
            text = await drawn_text(pilot, app, "test accuracy")
    finally:
        source.close()
    assert "no evaluation yet" not in text, text
    assert f"no test accuracy: the loss is {EXAMPLE}:loss, not cross-entropy" in text, text
