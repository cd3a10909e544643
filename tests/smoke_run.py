"""A real smoke sweep (profiles/smoke.toml: 5 strategies on 2 local ranks, tiny model), recorded to a file."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SMOKE_SEGMENTS = ["single batch=32", "gather-scatter batch=32", "allreduce batch=32", "allreduce async batch=32",
                  "ddp bucket=25MB batch=32"]
WARMUP, MEASURE = 2, 6  # profiles/smoke.toml


def record_smoke(folder: Path) -> Path:
    record = folder / "smoke.db"
    run = subprocess.run([sys.executable, "-m", "ddptop", "--headless", "--profile", "smoke", "--local", "2", "--backend",
                          "gloo", "--record", str(record)],
                         capture_output=True, text=True, timeout=180)
    assert run.returncode == 0, run.stderr
    return record
