"""Where a test phase's wall time goes (issue 40): each worker's busy time, its idle tail, and the files that took
longest, from the lines tests/conftest.py appends when DDPTOP_SUITE_TIMELINE names a file.

    DDPTOP_SUITE_TIMELINE=/tmp/timeline.tsv make test
    python3 scripts/test_timeline.py /tmp/timeline.tsv [--top 20]

CPU is the kernel's count for the worker process and for the children it waited for (a job's ranks, the CLI
processes a test starts); a process a test starts and never waits for is not in it."""

from __future__ import annotations

import argparse
import collections
import sys


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("timeline")
    ap.add_argument("--top", type=int, default=20)
    args = ap.parse_args(argv)
    rows = []
    try:
        with open(args.timeline) as f:
            for line in f:
                worker, nodeid, start, end, cpu, child = line.rstrip("\n").split("\t")
                rows.append((worker, nodeid, float(start), float(end), float(cpu), float(child)))
    except (OSError, ValueError) as exc:
        print(f"test_timeline: cannot read {args.timeline}: {exc}", file=sys.stderr)
        return 2
    if not rows:
        print(f"test_timeline: {args.timeline} holds no tests", file=sys.stderr)
        return 2
    first, last = min(r[2] for r in rows), max(r[3] for r in rows)
    print(f"{len(rows)} tests, {last - first:.0f} s from the first start to the last end\n")
    print("| worker | tests | busy s | CPU s (own + children) | first start s | last end s | idle at the end s |")
    print("|---|---|---|---|---|---|---|")
    for worker in sorted({r[0] for r in rows}):
        mine = [r for r in rows if r[0] == worker]
        busy = sum(r[3] - r[2] for r in mine)
        cpu = sum(r[4] + r[5] for r in mine)
        begin, end = min(r[2] for r in mine) - first, max(r[3] for r in mine) - first
        print(f"| {worker} | {len(mine)} | {busy:.0f} | {cpu:.0f} | {begin:.0f} | {end:.0f} | {last - first - end:.0f} |")
    files: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0.0, 0])
    for _, nodeid, start, end, cpu, child in rows:
        entry = files[nodeid.split("::")[0]]
        entry[0] += end - start
        entry[1] += cpu + child
        entry[2] += 1
    print(f"\nthe {args.top} files that took longest (wall summed over their tests)\n")
    print("| file | tests | wall s | CPU s |")
    print("|---|---|---|---|")
    for name, (wall, cpu, n) in sorted(files.items(), key=lambda kv: -kv[1][0])[:args.top]:
        print(f"| {name} | {n} | {wall:.1f} | {cpu:.1f} |")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except BrokenPipeError:  # `| head`: the reader has what it wanted
        sys.stderr.close()
        sys.exit(141)
