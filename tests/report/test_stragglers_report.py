"""Stragglers in `ddptop info` and the report, on the real smoke sweep (2 ranks, no straggler injected): nothing
is named, and the ranks' clocks (one machine's) are found equal within the uncertainty the ping-pong states."""

from __future__ import annotations

import json
import sqlite3

from ddptop.cli import main


def test_no_straggler_is_named_without_one(smoke, capsys):
    record, out = smoke
    assert main(["info", str(record)]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("stragglers"))
    assert line.startswith("stragglers no straggler: ")
    section = (out / "report.md").read_text().split("## Stragglers", 1)[1].split("\n## ", 1)[0]
    whole = next(row for row in section.splitlines() if "| whole run |" in row)
    assert "| no straggler: " in whole


def test_ranks_on_one_machine_share_a_clock_within_the_stated_uncertainty(smoke):
    record, _ = smoke
    rows = [json.loads(d) for (d,) in sqlite3.connect(record).execute(
        "SELECT data FROM events WHERE kind = 'clock_sync' ORDER BY seq")]
    assert [r["at"] for r in rows] == ["start", "end"]
    for row in rows:
        (_, zero, no_rtt), (rank, offset, rtt) = row["peers"]
        assert (zero, no_rtt, rank) == (0.0, 0.0, 1)
        assert abs(offset) <= rtt / 2 + 1e-6 and rtt < 0.05
