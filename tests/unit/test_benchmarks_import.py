"""Every script in benchmarks/ loads against the package as it is now, and each one that runs here runs its main path.

No test measures with the benchmarks (they measure for minutes), so an API change in ddptop broke them unseen, inside
`main()` where loading a module cannot look: `JobKeys.from_token` gained its `salt` argument and
`step_overhead_ab.py` and `collector_throughput.py` failed at their first line of work, found only when the GPU run
called them; later `run_front` came to hand its consumer a Feed and `step_overhead.py` died on `source.poll()`, and
`replay_seek.py` died at its end on the writer's `-reserve` file left by its killed writers (both found by this test).
Each script runs here as `python benchmarks/X.py` with its smallest arguments (a tiny model, 1-2 steps, two simulated
ranks for a second): exit 0, its table printed, no traceback. Not run: whatif_grid.py and whatif_lab.py build an
emulated cluster (root, network namespaces, minutes a job; `make lab-test` covers that path), and plain_torch.py is
a module the two step-overhead scripts import and run."""

from __future__ import annotations

import pathlib
import resource
import shutil
import subprocess
import sys

import pytest

BENCHMARKS = pathlib.Path(__file__).resolve().parents[2] / "benchmarks"

LOAD_ALL = """
import importlib.util, pathlib, sys, traceback
folder = pathlib.Path(sys.argv[1])
sys.path.insert(0, str(folder))
failed = []
for path in sorted(folder.glob("*.py")):
    spec = importlib.util.spec_from_file_location("bench_" + path.stem, path)
    try:
        spec.loader.exec_module(importlib.util.module_from_spec(spec))
    except BaseException as exc:
        failed.append(f"{path.name}: {type(exc).__name__}: {exc}")
print("\\n".join(failed) or "all loaded")
sys.exit(1 if failed else 0)
"""

# script: (its smallest arguments, a line of what it prints that only a finished main path prints)
RUNS = {
    "guess_cost.py": (["--seconds", "0.2"], "each guess costs "),
    "whatif_speed.py": (["--runs", "2"], "what-if table: 128 configurations"),
    "whatif_live.py": (["--runs", "1"], "recordings/whatif-lab.db: a refit of the segment in force took "),
    "synthetic_difficulty.py": (["--steps", "10", "--size", "320"], "step 10: loss "),
    "collector_throughput.py": (["--ranks", "2", "--seconds", "1"], "| 2 | "),
    "replay_seek.py": (["--ranks", "1", "--hours", "0.01", "--seeks", "2", "--kills", "1"],
                       "| SIGKILL mid-stream: newest step kept | "),
    "step_overhead.py": (["--steps", "2", "--warmup", "1", "--model", "tiny", "--batch", "4", "--cases", "single",
                          "--ranks", "1"], "| single | "),
    "step_overhead_ab.py": (["--blocks", "1", "--block-steps", "2", "--model", "tiny", "--batch", "4", "--cases",
                             "single", "--front-steps", "3", "--front-rounds", "1"], "| strategy | front CPU ms/step"),
    "tui_cpu.py": (["--ranks", "2", "--seconds", "2", "--warmup", "0.5"], "  mean "),
    "cpu_per_step.py": (["--rounds", "1", "--steps", "2,4", "--modes", "off"], "| off | "),  # 2 whole runs
    "scale_screen.py": (["--ranks", "16", "--seconds", "0.5"], "drawing the Ranks panel at 16 ranks: "),
    "thread_cpu.py": (["--window", "1", "--after", "5", "--steps", "2000"], "| front, all threads | "),
}
NOT_RUN = {"whatif_grid.py", "whatif_lab.py", "plain_torch.py"}


def test_every_benchmark_script_loads_and_each_is_run_or_said_why_not():
    scripts = sorted(p.name for p in BENCHMARKS.glob("*.py"))
    assert "step_overhead_ab.py" in scripts and len(scripts) >= 10, scripts
    assert set(scripts) == set(RUNS) | NOT_RUN, "a new benchmark: give it a run in RUNS (or a reason in NOT_RUN)"
    run = subprocess.run([sys.executable, "-c", LOAD_ALL, str(BENCHMARKS)], capture_output=True, text=True,
                         timeout=240, cwd=BENCHMARKS.parent)
    assert run.returncode == 0, run.stdout + run.stderr[-2000:]


@pytest.mark.parametrize("script", sorted(RUNS))
def test_the_benchmark_runs_its_main_path(script):
    if script == "tui_cpu.py" and shutil.which("tmux") is None:
        pytest.skip("tui_cpu.py drives the app in tmux, which is not installed")
    argv, said = RUNS[script]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    run = subprocess.run([sys.executable, str(BENCHMARKS / script), *argv], capture_output=True, text=True,
                         timeout=300, cwd=BENCHMARKS.parent)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    print(f"{script}: {after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime:.1f} s of CPU")
    assert run.returncode == 0 and "Traceback" not in run.stderr, (run.stdout[-2000:], run.stderr[-3000:])
    assert any(line.startswith(said) for line in run.stdout.splitlines()), run.stdout[-3000:]
