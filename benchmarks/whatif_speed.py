"""The what-if table's cost (issue 23: 4 strategies × 8 bucket sizes × 4 world sizes in under 100 ms).

Reads segment 3 of recordings/cs744-lab.db (VGG-11 DDP 25 MB on 4 lab hosts: 34 layers, its sampled steps), then
times `fit` + `predict` over 128 configurations: DDP at each of 8 bucket sizes, per-parameter all_reduce sync and
async, gather+scatter, each at 2, 4, 8 and 16 ranks (the non-DDP rows once per bucket size, as the grid asks).
Reading the file is not timed (the screen holds the segment already). Prints the median and the spread.

    .venv/bin/python benchmarks/whatif_speed.py [--runs 20] [--file recordings/cs744-lab.db] [--segment 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from ddptop.metrics.whatif import Config, fit, predict  # noqa: E402
from ddptop.record.reader import Recording  # noqa: E402
from ddptop.record.whatif import segment_data  # noqa: E402

BUCKETS = (1, 2, 5, 10, 25, 50, 75, 100)
WORLDS = (2, 4, 8, 16)


def table(seg) -> int:
    model = fit(seg)
    n = 0
    for world in WORLDS:
        for mb in BUCKETS:
            for config in (Config("ddp", mb, False, world), Config("allreduce", None, False, world),
                           Config("allreduce", None, True, world), Config("gather-scatter", None, False, world)):
                predict(model, config)
                n += 1
    return n


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--file", default=os.path.join(os.path.dirname(__file__), "..", "recordings", "cs744-lab.db"))
    p.add_argument("--segment", type=int, default=3)
    args = p.parse_args()
    with Recording.open(args.file) as rec:
        seg = segment_data(rec, args.segment)
    times = []
    for _ in range(args.runs):
        t0 = time.perf_counter()
        n = table(seg)
        times.append(time.perf_counter() - t0)
    print(f"what-if table: {n} configurations ({len(seg.layers)} layers, {seg.world_size} ranks fitted), "
          f"median {1e3 * statistics.median(times):.1f} ms, min {1e3 * min(times):.1f}, max {1e3 * max(times):.1f} "
          f"over {args.runs} runs (goal: < 100 ms)")


if __name__ == "__main__":
    main()
