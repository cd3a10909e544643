"""The user's own code that raises while training (issue 44: not at the sample batch ddptop checks before any rank
starts, but at batch 7 or step 3) is the user's error, said as such: one line per rank naming the file, line and
function of their code and the exception, exit 3 (docs/reference/exit-codes.md), never "internal error" (exit 70,
a bug of ddptop's) and never a traceback; the same from a DataLoader worker process, where torch keeps the user's
frame only in the text of the exception it raises again in the rank."""

from __future__ import annotations

import subprocess
import sys

import pytest

import ports

DDPTOP = [sys.executable, "-m", "ddptop"]
CODE = '''
import torch
from torch import nn
from torch.utils.data import default_collate

batches = {"n": 0}


def collate(items):
    batches["n"] += 1
    if batches["n"] > 6:
        raise ValueError("item 3 has no label")
    return default_collate(items)


class Picky(nn.Module):
    def __init__(self, num_classes=10):
        super().__init__()
        self.fc = nn.Linear(3 * 32 * 32, num_classes)
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        if self.calls > 4:
            raise RuntimeError("shape mismatch on purpose")
        return self.fc(x.flatten(1))


def model(num_classes=10):
    return Picky(num_classes)
'''


def line_of(text: str) -> int:
    return next(n for n, line in enumerate(CODE.splitlines(), 1) if text in line)


@pytest.mark.parametrize("flags, where", [
    (["--model", "tiny", "--collate", "{code}:collate"],
     f"user_code.py:{line_of('item 3 has no label')} in collate: ValueError: item 3 has no label"),
    (["--model", "{code}:model"],
     f"user_code.py:{line_of('shape mismatch on purpose')} in forward: RuntimeError: shape mismatch on purpose"),
    # in a DataLoader worker process (GPU runs have workers): torch re-raises it in the rank without the user's frame,
    # the worker's traceback only as text in the message
    (["--model", "tiny", "--collate", "{code}:collate", "--workers", "1"],
     f"user_code.py:{line_of('item 3 has no label')} in collate: ValueError: item 3 has no label"),
], ids=["collate", "forward", "collate in a loader worker"])
def test_the_users_code_raising_mid_run_is_one_line_each_rank_and_exit_3(tmp_path, flags, where):
    code = tmp_path / "user_code.py"
    code.write_text(CODE)
    args = [f.format(code=code) for f in flags]
    run = subprocess.run(DDPTOP + ["--headless", "--local", "2", "--steps", "20", "--synthetic-size", "640",
                                   "--batch-size", "16", "--no-eval", "--no-record", "--port", str(ports.port()),
                                   *args], capture_output=True, text=True, timeout=240, cwd=tmp_path)
    assert run.returncode == 3, run.stderr[-2000:]
    said = [line for line in run.stderr.splitlines() if "your code raised" in line]
    assert sorted(said) == sorted(f"ddptop rank {r}: your code raised at {where} (DDPTOP_DEBUG=1 shows where)"
                                  for r in (0, 1)), run.stderr[-2000:]
    assert "internal error" not in run.stderr and "Traceback" not in run.stderr, run.stderr[-2000:]
