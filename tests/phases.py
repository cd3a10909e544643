"""Which test files each phase of `make test` / `make lab-test` runs, by path (python tests/phases.py PHASE prints
pytest's arguments), so each phase collects only its own files instead of all 2,200 tests four times (~16 s of CPU
each); conftest.py marks the same files `alone` and `lab` from these lists.

Phases: `shared` (two at a time under pytest-xdist), `alone` (tests whose assertions are about time, link rates or
CPU shares, one at a time after the rest), `lab-shared` and `lab-alone` (tests/lab: an emulated cluster, root)."""

from __future__ import annotations

import sys
from pathlib import Path

LAB = "tests/lab/"
# Each asserts time, link rates or CPU shares (always against something measured in the same run: a shaped link's
# rate, an injected delay, the wall clock of the same steps), so no other test competes for the two cores.
# tests/tui/test_e2e_tmux.py too: it asserts what the screen and the recording say, not how fast, but it types into a
# real terminal at a human pace, and beside the other worker's jobs the app fell seconds behind the keys (two CI runs,
# 2026-11-28: "bucket MB never had the focus", the Tabs processed late cycled panels). Not here: the report's memory
# test (peak RSS, and CPU time as a ratio of two sizes of the same report).
ALONE = ("tests/lab/test_course.py", "tests/lab/test_truth.py", "tests/lab/test_links.py",
         "tests/lab/test_cgroup_weight.py", "tests/lab/test_wire_bytes.py", "tests/lab/test_straggler_clocks.py",
         "tests/lab/test_hints_link.py", "tests/lab/test_outage.py", "tests/lab/test_tune_lab.py",
         "tests/lab/test_change_point_lab.py", "tests/lab/test_zero_lab.py",
         "tests/ranks/test_timing_truth.py", "tests/ranks/test_micro_steps_truth.py", "tests/tui/test_e2e_tmux.py")


def files(phase: str, root: Path) -> list[str]:
    """The test files of `phase`, relative to the repository root, sorted. A file with some tests marked
    `@pytest.mark.alone` is in both phases of its kind: each phase's `-m` picks its tests."""
    every = sorted(str(p.relative_to(root)) for p in (root / "tests").rglob("test_*.py"))
    lab = {p for p in every if p.startswith(LAB)}
    alone = {p for p in every if p in ALONE}
    marked = {p for p in every if "mark.alone" in (root / p).read_text()}
    chosen = {"shared": set(every) - lab - alone, "alone": (alone | marked) - lab, "lab-shared": lab - alone,
              "lab-alone": lab & (alone | marked)}[phase]
    return sorted(chosen)


def main(argv: list[str]) -> int:
    root = Path(__file__).resolve().parents[1]
    if len(argv) != 1 or argv[0] not in ("shared", "alone", "lab-shared", "lab-alone"):
        print("usage: python tests/phases.py shared|alone|lab-shared|lab-alone", file=sys.stderr)
        return 2
    missing = [p for p in ALONE if not (root / p).is_file()]
    if missing:  # a file renamed without its entry here would silently join the shared phase
        print(f"tests/phases.py: ALONE names files that do not exist: {', '.join(missing)}", file=sys.stderr)
        return 2
    print(" ".join(files(argv[0], root)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
