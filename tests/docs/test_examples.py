"""The docs' example output is today's (issue 46: the README's example had gone stale, showing a profile order, lr,
switch line and accuracy the code no longer gave). The headless example in docs/getting-started.md is run again
with the command the page names, and every line of it must be a line the run prints now, numbers aside (step
times, losses and accuracies differ from run to run; the words, the order of the segments, their configurations
and the step numbers must not)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from ports import port

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "getting-started.md"
COMMAND = ("--headless --profile cs744-compare --local 2 --model tiny --synthetic-size 640 --batch-size 16").split()


def shape(line: str) -> str:
    """A line with its measured numbers as # and its spacing as one space; step numbers are kept. The CPU of
    ddptop's other threads (`; +0.77 ms CPU on its threads`) is on a line once the rank's first reading came, about a
    second in: which line that is depends on the machine's speed, so it is left out on both sides; the run's later lines must carry it."""
    line = re.sub(r"; \+[\d.]+ [mµ]?s CPU on its threads", "", line)
    line = re.sub(r"\bstep (\d+)", r"step N\1N", line)  # N25N: a word, which the next line leaves alone
    line = re.sub(r"(?<![\w.])\d+(\.\d+)?(?![\w.])", "#", line)
    return " ".join(line.split())


def example() -> list[str]:
    text = PAGE.read_text()
    start = text.index("--profile cs744-compare --local 2 --model tiny --synthetic-size 640 --batch-size 16")
    block = text[text.index("```", start) + 3:]
    block = block[block.index("\n") + 1:block.index("```")]
    return [line for line in block.splitlines() if line.strip() and line.strip() != "..."]


def test_the_getting_started_example_is_what_the_command_prints_now(tmp_path):
    lines = example()
    assert len(lines) >= 10 and any("now gather-scatter" in line for line in lines)
    done = subprocess.run([sys.executable, "-m", "ddptop", *COMMAND, "--no-record", "--port", str(port())],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(ROOT), "DDPTOP_STATE_DIR": str(tmp_path / "state")})
    assert done.returncode == 0, done.stderr[-3000:]
    printed = {shape(line) for line in done.stdout.splitlines()}
    assert any(re.search(r"; \+[\d.]+ [mµ]?s CPU on its threads\)$", line) for line in done.stdout.splitlines()
               if line.startswith("step 100/100")), done.stdout[-2000:]
    stale = [line for line in lines if shape(line) not in printed]
    assert not stale, ("docs/getting-started.md's example is not what the command prints now (numbers aside): "
                       f"{stale}\n--- printed:\n{done.stdout[-4000:]}")
