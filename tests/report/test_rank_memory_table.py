"""The report's memory table at many ranks (issue 43): 16 ranks a segment listed, the rest in one row of their
largest figures, which the test works out from the samples themselves."""

from __future__ import annotations

from types import SimpleNamespace

from ddptop.events import MemorySample
from ddptop.metrics.memory import memory_table
from ddptop.report.page import MEMORY_RANKS, memory_blocks


def test_past_16_ranks_a_segment_the_rest_are_one_row_of_their_largest_figures():
    samples = [MemorySample(rank, step, 0, 1.0 + step, 1000 + rank, 2000 - rank, 3000, 10_000 + 7 * rank * (step + 1),
                            5, 0, "process USS") for step in (0, 1) for rank in range(20)]
    run = SimpleNamespace(name="big", memory=memory_table(samples))
    (_, title), (_, header, rows), _note = memory_blocks([run])
    assert title == "Memory per rank" and header[2] == "rank" and len(rows) == MEMORY_RANKS + 1
    assert [r[2] for r in rows[:MEMORY_RANKS]] == [str(k) for k in range(MEMORY_RANKS)]
    rest = [s for s in samples if s.rank >= MEMORY_RANKS]
    assert rows[-1] == ["big", "0", f"{20 - MEMORY_RANKS} more (largest)", str(max(s.param_bytes for s in rest)),
                        str(max(s.grad_bytes for s in rest)), "3000", str(max(s.peak_bytes for s in rest)), "–",
                        str(len(rest))]
    assert rows[3][3:7] == ["1003", "1997", "3000", str(10_000 + 7 * 3 * 2)]  # rank 3: its own, its larger peak
