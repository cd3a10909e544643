"""scripts/gpu_check.py --cpu: the GPU checks' plumbing (launches, recordings, ctl, the roll-back) on the CPU, so the
script tests/gpu/test_cuda.py calls cannot rot on a machine without a GPU. Runs everywhere, GPU or not."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SEEN = {"cuda": ("nccl world size 1", "rank on cuda:0 with nccl", "CUDA-event spans", "memory by kind", "GPU step time vs wall clock",
                 "nccl with two ranks on a GPU is refused", "2 ranks, gloo on CUDA tensors, ddp"),
        "oom": ("ctl set of a batch that does not fit", "the job keeps the previous batch",
                "a batch that fits is applied after the trial step", "the job trains on and ends cleanly"),
        "sharded": ("sharded sweep", "every switch on one step, one fingerprint", "one final fingerprint",
                    "zero1 momentum shares add up to the model", "memory by kind per strategy")}


@pytest.mark.parametrize("what", ["cuda", "oom", "sharded"])
def test_gpu_check_runs_every_check_on_the_cpu_and_each_passes(what, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO), "OUT": str(tmp_path)}
    done = subprocess.run([sys.executable, "scripts/gpu_check.py", what, "--cpu"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=240)
    passed = [line[5:].split(": ")[0] for line in done.stdout.splitlines() if line.startswith("PASS")]
    assert done.returncode == 0 and done.stdout.rstrip().endswith("0 failed: none"), done.stdout + done.stderr
    assert sorted(passed) == sorted(SEEN[what]), done.stdout
