"""Every script in benchmarks/ still loads against the package as it is now.

No test runs the benchmarks (they measure for minutes), so an API change in ddptop broke two of them unseen:
`JobKeys.from_token` gained its `salt` argument and `step_overhead_ab.py` and `collector_throughput.py` failed at
their first line of work, found only when the GPU run called them. Each module is loaded here, in one interpreter,
as `python benchmarks/X.py` would load it (its folder first on sys.path), without running its `main`."""

from __future__ import annotations

import pathlib
import subprocess
import sys

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


def test_every_benchmark_script_loads():
    scripts = sorted(p.name for p in BENCHMARKS.glob("*.py"))
    assert "step_overhead_ab.py" in scripts and len(scripts) >= 10, scripts
    run = subprocess.run([sys.executable, "-c", LOAD_ALL, str(BENCHMARKS)], capture_output=True, text=True,
                         timeout=240, cwd=BENCHMARKS.parent)
    assert run.returncode == 0, run.stdout + run.stderr[-2000:]
