"""DESIGN.md's import rules: the core never imports textual; record, state and events never import torch."""

from __future__ import annotations

import subprocess
import sys

import pytest

CORE = ["ddptop.train.worker", "ddptop.train.launch", "ddptop.probes.step", "ddptop.sources.sampler",
        "ddptop.control.agent", "ddptop.control.client", "ddptop.record.sqlite", "ddptop.headless", "ddptop.run"]
NO_TORCH = ["ddptop.events", "ddptop.record.reader", "ddptop.record.replay", "ddptop.record.export",
            "ddptop.state.session", "ddptop.report.analysis", "ddptop.traffic", "ddptop.cli", "ddptop.lab.command",
            "ddptop.lab.launch", "ddptop.lab.summary", "ddptop.control.client", "ddptop.control.status",
            "ddptop.front.feed", "ddptop.headless"]


def loaded(module: str) -> set[str]:
    code = f"import sys, importlib; importlib.import_module({module!r}); print(' '.join(sys.modules))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return {name.split(".")[0] for name in result.stdout.split()}


@pytest.mark.parametrize("module", CORE)
def test_the_core_never_imports_textual(module):
    assert "textual" not in loaded(module)


@pytest.mark.parametrize("module", NO_TORCH)
def test_replay_side_never_imports_torch(module):
    assert "torch" not in loaded(module)
