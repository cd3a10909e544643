"""The live What-if panel's cost on the screen's thread: one refit of the segment in force as the session state's
Advisor does it (the model's input assembled from the state's kept steps and sampled spans, the fit, advise's
table of 9 configurations), at the end of each segment of a recording replayed into a SessionState.

    .venv/bin/python benchmarks/whatif_live.py [--runs 5] [--file recordings/whatif-lab.db]

Prints the median and the maximum. The refit runs at most every REFIT_S (3 s) while steps come in, and at once for
a new segment or a switch (state/advising.py); the snapshot holds the lock the feed's thread applies events under.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from ddptop.record.reader import Recording  # noqa: E402
from ddptop.state.session import SessionState  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--file", default="recordings/whatif-lab.db")
    args = p.parse_args()
    events = list(Recording.open(args.file).events())
    state, times, segment = SessionState(), [], 0
    for e in events + [None]:
        if e is None or getattr(e, "segment", segment) > segment:  # the segment in force ends: time its refit
            state.snapshot()  # every earlier switch predicted, as live
            table = tuple(state.table.segments())
            fig = next((f for f in table if f.index == segment and f.measured_steps), None)
            for _ in range(args.runs if fig is not None else 0):
                state.advisor._fits.pop(segment, None)
                start = time.perf_counter()
                state.advisor.view(state, table)
                times.append(time.perf_counter() - start)
            segment = getattr(e, "segment", segment)
        if e is not None:
            state.apply(e)
    print(f"{args.file}: a refit of the segment in force took {statistics.median(times) * 1e3:.1f} ms median, "
          f"{max(times) * 1e3:.1f} ms at most ({len(times)} refits, load average {os.getloadavg()[0]:.1f})")


if __name__ == "__main__":
    main()
