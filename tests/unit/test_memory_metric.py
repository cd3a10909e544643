"""Each rank's memory by kind (issue 43), its parts checked alone: the per-segment definition (metrics.memory) against
figures worked out by hand, the unique-memory read against the kernel's other files (/proc/self/smaps summed over
every mapping, /proc/self/status), the held bytes against torch's own sizes, a tied weight, a view and an optimizer
that wraps another (ZeroRedundancyOptimizer keeps its shard's state in `.optim`)."""

from __future__ import annotations

import os

import pytest
import torch
from torch import nn

from ddptop.events import EventDecodeError, MemorySample, event_from_dict
from ddptop.metrics.memory import MemoryTable, memory_table
from ddptop.probes.memory import held_bytes
from ddptop.sources.memory import UniqueMemory, parse_rollup, parse_statm

MB = 10 ** 6


def sample(rank, step, segment, params, grads, optim, peak, now=None, by="process USS"):
    return MemorySample(rank, step, segment, 1.7e9 + step, params, grads, optim, peak, peak if now is None else now,
                        0, by, 0.01 * (step + 1))


def test_a_segments_kinds_are_its_latest_sample_and_its_peak_the_largest():
    samples = [sample(0, 0, 0, 8 * MB, 8 * MB, 8 * MB, 300 * MB), sample(1, 0, 0, 8 * MB, 8 * MB, 8 * MB, 290 * MB),
               sample(0, 50, 0, 8 * MB, 8 * MB, 8 * MB, 310 * MB), sample(0, 90, 0, 8 * MB, 8 * MB, 8 * MB, 305 * MB),
               # segment 1: a sharded strategy, the state a third (3 ranks), the first sample before the state exists
               sample(0, 100, 1, 8 * MB // 3, 0, 0, 250 * MB), sample(0, 140, 1, 8 * MB // 3, 8 * MB // 3,
                                                                     8 * MB // 3, 240 * MB)]
    rows = memory_table(samples)
    assert [(r.segment, r.rank) for r in rows] == [(0, 0), (0, 1), (1, 0)]
    first, other, sharded = rows
    assert (first.samples, first.step, first.peak_bytes, first.now_bytes) == (3, 90, 310 * MB, 305 * MB)
    assert first.held_bytes == 24 * MB and first.cost_s == pytest.approx(0.91)
    assert (other.samples, other.peak_bytes) == (1, 290 * MB)
    assert (sharded.param_bytes, sharded.grad_bytes, sharded.optim_bytes) == (2666666, 2666666, 2666666)
    assert (sharded.peak_bytes, sharded.samples) == (250 * MB, 2)  # the first sample's peak is the segment's
    table = MemoryTable().apply_all(samples)
    assert table.latest_segment() == 1 and table.rows(0) == rows[:2]


def test_a_memory_sample_says_what_measured_it():
    data = {**sample(0, 1, 0, 1, 2, 3, 4).to_dict(), "by": "a guess"}
    with pytest.raises(EventDecodeError, match="memory_sample"):
        event_from_dict(data)
    assert event_from_dict({**data, "by": "cuda allocator"}).by == "cuda allocator"


def _kb_sum(text: str, names: tuple[str, ...]) -> int:
    return 1024 * sum(int(line.split()[1]) for line in text.splitlines() if line.split(":")[0] in names)


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps_rollup"), reason="a kernel without smaps_rollup (< 4.14)")
def test_the_unique_memory_is_every_mappings_private_pages_as_smaps_lists_them():
    keep = bytearray(64 * MB)  # noqa: F841  (64 MB of private pages, written: the figure moves with it)
    reader = UniqueMemory()
    assert reader.by == "process USS"
    with open("/proc/self/smaps") as f:  # one entry per mapping: the kernel's sum in smaps_rollup, added up here
        whole = _kb_sum(f.read(), ("Private_Clean", "Private_Dirty"))
    read = reader.read()
    assert abs(read - whole) < 4 * MB and read > 64 * MB
    assert parse_rollup("Rss: 10 kB\nPrivate_Clean: 3 kB\nPrivate_Dirty: 5 kB\n") == 8 * 1024
    assert parse_rollup("Rss: 10 kB\n") is None


def test_without_smaps_rollup_the_reader_falls_back_to_statm_which_is_the_anonymous_memory(tmp_path):
    reader = UniqueMemory(rollup=str(tmp_path / "missing"))
    assert reader.by == "process statm"
    with open("/proc/self/status") as f:
        anon = _kb_sum(f.read(), ("RssAnon",))
    assert abs(reader.read() - anon) < 4 * MB
    assert parse_statm("100 40 15 1 0 30 0", 4096) == 25 * 4096 and parse_statm("", 4096) is None


class Tied(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(100, 16)
        self.body = nn.Linear(16, 16)
        self.head = nn.Linear(16, 100, bias=False)
        self.head.weight = self.emb.weight  # one storage under two names

    def forward(self, x):
        return self.head(self.body(self.emb(x)))


class Wrapping:
    """What torch's ZeroRedundancyOptimizer looks like to the count: its own state empty, the local one's in .optim."""

    def __init__(self, optim):
        self.state, self.optim = {}, optim


def test_held_bytes_count_each_storage_once_and_the_state_a_wrapped_optimizer_keeps():
    model = Tied()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    unique = {p.data_ptr(): p.numel() * p.element_size() for p in model.parameters()}  # torch lists a tie once
    assert held_bytes(model, optimizer) == (sum(unique.values()), 0, 0)  # no gradient or momentum yet
    model(torch.randint(0, 100, (4,))).sum().backward()
    optimizer.step()
    expected = sum(unique.values())
    assert held_bytes(model, optimizer) == (expected, expected, expected)  # momentum: one buffer per parameter
    assert held_bytes(model, Wrapping(optimizer)) == (expected, expected, expected)
    adam = torch.optim.Adam(model.parameters())
    adam.step()
    steps = sum(s["step"].numel() * s["step"].element_size() for s in adam.state.values())  # Adam's step counters
    assert held_bytes(model, adam)[2] == 2 * expected + steps


def test_a_view_of_a_parameter_counts_its_whole_storage_once():
    flat = nn.Parameter(torch.zeros(1000))
    module = nn.Module()
    module.flat = flat
    module.register_buffer("unused", torch.zeros(1))  # buffers are not parameters: not counted
    optimizer = torch.optim.SGD([flat], lr=0.1)
    optimizer.state[flat] = {"a": flat.detach()[:10], "b": flat.detach()[500:]}  # views of the parameter: held once
    assert held_bytes(module, optimizer) == (4000, 0, 0)


def test_every_memory_term_is_in_the_documentations_glossary():
    from pathlib import Path

    from ddptop.metrics.memory import GLOSSARY

    glossary = (Path(__file__).resolve().parents[2] / "docs" / "reference" / "glossary.md").read_text().lower()
    assert [term for term in GLOSSARY if f"| {term.lower()} |" not in glossary] == []
