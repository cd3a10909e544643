"""Provides the many-ranks view of a snapshot: each figure's spread over ranks, scores, the top k, a rank × step heatmap.

From metrics.ranks.SCALE_RANKS ranks the Ranks and Network panels draw this instead of a row per rank. Each rank's
figures are its window of its last RECENT_STEPS steps (Snapshot.recent: the ranks table's means), reduced by
metrics.ranks (one definition: the Prometheus endpoint's spreads and top k are the same functions). Ranks group by
node: a node is a host, whose ranks share its NIC.
"""

from __future__ import annotations

import itertools
import statistics
from dataclasses import dataclass, field
from typing import Mapping

from ddptop.metrics import Figures
from ddptop.metrics.ranks import FIGURES, SCORED_BY, score, spread, top, worst


@dataclass(frozen=True)
class ScaleView:
    """A job reduced to a few numbers per figure (metrics.ranks.FIGURES) and a score per rank."""

    by_rank: Mapping[int, Figures] = field(default_factory=dict)  # every rank that has stepped
    spreads: Mapping[str, Mapping[str, float]] = field(default_factory=dict)  # figure → {median, p90, worst}
    worst: Mapping[str, int | None] = field(default_factory=dict)  # figure → the rank that is its worst
    scores: Mapping[int, float] = field(default_factory=dict)  # rank → metrics.ranks.score of its busy time
    order: tuple[int, ...] = ()  # every rank by score, the lowest (the slowest) first

    def top(self, k: int) -> tuple[int, ...]:
        return self.order[:k]


def figure_of(f: Figures, name: str) -> float:
    return getattr(f, FIGURES[name][0])


def scale_view(snap) -> ScaleView:
    """The view of every rank that has stepped (lost and finished ones too: a finished replay still summarizes);
    a rank's sampled steps are left out of its window as the ranks table leaves them out. Computed once per snapshot
    (kept in it, as Snapshot keeps its own derived figures)."""
    cached = getattr(snap, "__dict__", {}).get("_scale")
    if cached is not None:
        return cached
    by_rank = {r.rank: snap.recent(r.rank) for r in snap.ranks if snap.history.get(r.rank)}
    by_rank = {r: f for r, f in by_rank.items() if f.steps}
    values = {name: {r: figure_of(f, name) for r, f in by_rank.items()} for name in FIGURES}
    scores = score(values[SCORED_BY])
    view = ScaleView(by_rank=by_rank, spreads={name: spread(v.values()) for name, v in values.items()},
                     worst={name: worst(v) for name, v in values.items()}, scores=scores,
                     order=tuple(top({r: -s for r, s in scores.items()}, len(scores))))
    if hasattr(snap, "__dict__"):
        snap.__dict__["_scale"] = view
    return view


def node_groups(snap) -> list[tuple[str, tuple[int, ...]]]:
    """(host, its ranks) in the order of each host's lowest rank; a rank whose host is not known yet is its own."""
    groups: dict[str, list[int]] = {}
    for r in sorted(snap.ranks, key=lambda v: v.rank):
        groups.setdefault(r.host if r.host != "?" else f"r{r.rank}?", []).append(r.rank)
    return [(host, tuple(ranks)) for host, ranks in groups.items()]


def rank_span(ranks: tuple[int, ...]) -> str:
    """r24-31 for a run of ranks, r3 for one, r1,5,9 for a few others, r1,5,…(8) for more."""
    if len(ranks) == 1:
        return f"r{ranks[0]}"
    if list(ranks) == list(range(ranks[0], ranks[-1] + 1)):
        return f"r{ranks[0]}-{ranks[-1]}"
    text = ",".join(map(str, ranks[:3]))
    return f"r{text}" + (f",…({len(ranks)})" if len(ranks) > 3 else "")


def heat_rows(snap, rows: int) -> list[tuple[str, tuple[int, ...]]]:
    """The heatmap's rows, at most `rows` of them: a rank each when they fit, else a node each (host: its ranks),
    else runs of neighbouring nodes (as many per row as it takes)."""
    rows = max(1, rows)
    if len(snap.ranks) <= rows:
        return [(f"r{r.rank} {r.host}", (r.rank,)) for r in sorted(snap.ranks, key=lambda v: v.rank)]
    nodes = node_groups(snap)
    per = -(-len(nodes) // rows)
    out = []
    for i in range(0, len(nodes), per):
        chunk = nodes[i:i + per]
        ranks = tuple(r for _, rs in chunk for r in rs)
        host = chunk[0][0] if per == 1 else f"{chunk[0][0]}+{len(chunk) - 1}"
        out.append((f"{host} {rank_span(ranks)}", ranks))
    return out


@dataclass(frozen=True)
class Heat:
    """A rank × step heatmap of one figure: each row's cells, one per step from `first`, the worst (largest) value
    of the row's ranks at that step (None: none of them reported it, or only as a sampled step), and the median over
    every rank's values shown, which the cells' levels compare with (metrics.ranks.heat_level)."""

    figure: str
    first: int = 0
    labels: tuple[str, ...] = ()
    cells: tuple[tuple[float | None, ...], ...] = ()
    middle: float = 0.0


class StepValues:
    """Each rank's value of one figure at each of its newest steps, kept between redraws: a rank's history only grows
    at its end, so a redraw reads the steps that arrived since the last one (at 256 ranks × 139 steps, reading every
    step each time was 50 ms of a redraw's CPU here). A rank whose newest step went back (a replay's seek) is read
    anew; steps that scroll out of the window are dropped."""

    def __init__(self) -> None:
        self.figure: str | None = None
        self.values: dict[int, dict[int, float]] = {}

    def read(self, snap, figure: str, ranks, first: int) -> dict[int, dict[int, float]]:
        if figure != self.figure:
            self.figure, self.values = figure, {}
        of_step = FIGURES[figure][1]
        for rank in ranks:
            history = snap.history.get(rank, ())
            values = self.values.get(rank)
            newest = max(values, default=-1) if values else -1
            if values is None or not history or history[-1].step < newest:
                values = self.values[rank] = {}
                newest = -1
            for d in reversed(history):
                if d.step < first or d.step <= newest:
                    break
                if not d.sampled:
                    values[d.step] = of_step(d)
            if values and len(values) > 2 * (max(values) - first + 1):  # now and then: it reads every step
                for step in [s for s in values if s < first]:
                    del values[step]
        return {rank: self.values[rank] for rank in ranks}


def heat(snap, figure: str, groups: list[tuple[str, tuple[int, ...]]], steps: int, job: bool = False,
         cache: StepValues | None = None) -> Heat:
    """The heatmap of `figure` (metrics.ranks.FIGURES) over the newest `steps` steps; sampled steps are left out
    (their layer hooks slow them, as every time figure leaves them out). The median the levels compare with is over
    the rows' ranks, over every rank of the job with `job` (a detail's few rows against the whole job). `cache`: a
    StepValues kept by the caller between redraws."""
    last = max((d[-1].step for d in snap.history.values() if d), default=-1)
    first = max(0, last - steps + 1)
    ranks = {r for _, rs in groups for r in rs} | ({r.rank for r in snap.ranks} if job else set())
    by_rank = (cache or StepValues()).read(snap, figure, sorted(ranks), first)
    every = list(itertools.chain.from_iterable(values.values() for values in by_rank.values()))
    span = range(first, last + 1)
    missing = itertools.repeat(-1.0)  # no value (times are never negative); map and max run in C: 35k cells, ~3 ms
    aligned = {rank: list(map(values.get, span, missing)) for rank, values in by_rank.items()}
    cells = []
    for _, ranks in groups:  # a row's cell: the largest of its ranks' values at that step
        row = map(max, *(aligned[r] for r in ranks)) if len(ranks) > 1 else aligned[ranks[0]]
        cells.append(tuple(None if v < 0 else v for v in row))
    return Heat(figure, first, tuple(label for label, _ in groups), tuple(cells),
                statistics.median(every) if every else 0.0)
