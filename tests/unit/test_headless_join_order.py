"""Every rank's "joined" line comes before the first step's line (issue 44: "rank 1 joined" printed after step 1),
whatever order the ranks' telemetry arrives in. The events are the committed live-switch.db's own (2 ranks), handed
to the headless printer with rank 0's first step ahead of rank 1's join, as a slower rank 1's batch brings them."""

from __future__ import annotations

import io
from pathlib import Path

from ddptop.events import RankJoined, RunStarted, StepDone
from ddptop.front.headless import HeadlessPrinter
from ddptop.record.reader import Recording

REC = Path(__file__).resolve().parents[2] / "recordings" / "live-switch.db"


def first_events() -> tuple[RankJoined, RankJoined, RunStarted, StepDone, StepDone]:
    with Recording.open(str(REC)) as rec:
        events = list(rec.between(float("-inf"), rec.time_of_step(1)))
    joined = {e.rank: e for e in events if isinstance(e, RankJoined)}
    started = next(e for e in events if isinstance(e, RunStarted))
    first = {e.rank: e for e in events if isinstance(e, StepDone) and e.step == 0}
    return joined[0], joined[1], started, first[0], first[1]


def test_a_rank_joining_after_rank_0s_first_step_is_still_said_before_it():
    join0, join1, started, step0, step1 = first_events()
    out = io.StringIO()
    printer = HeadlessPrinter(every=10, out=out, bar=False)
    printer.handle([join0, started, step0])  # rank 0's batch: its join, the run, its first step
    printer.handle([join1, step1])  # rank 1's, a moment later
    lines = out.getvalue().splitlines()
    said = [i for i, line in enumerate(lines) if " joined from " in line]
    first = next(i for i, line in enumerate(lines) if line.startswith("step "))
    assert len(said) == 2 and max(said) < first, lines


def test_a_rank_that_never_joins_holds_the_first_line_only_until_the_end():
    join0, _, started, step0, _ = first_events()
    out = io.StringIO()
    printer = HeadlessPrinter(every=10, out=out, bar=False)
    printer.handle([join0, started, step0])
    printer.finish(traffic=False)
    assert any(line.startswith("step ") for line in out.getvalue().splitlines()), out.getvalue()
