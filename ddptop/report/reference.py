"""Published figures beside a run's own: the `[[reference]]` tables of the profile a recording ran (a course
report's seconds per iteration), each row matched to the segments that ran that configuration, pooled over rounds.

Absolute times differ with the hardware; what a reproduction can show is the order of the configurations and
their ratios, so both sides are also given as speedup over the first row (CS744: over the single node).
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path

from ddptop.errors import UsageError
from ddptop.profiles import Reference, profile_references
from ddptop.report import plot
from ddptop.report.analysis import SegmentStats, pooled
from ddptop.report.figures import Made, _offsets
from ddptop.report.markdown import untrusted


@dataclass(frozen=True)
class Row:
    name: str  # the configuration, as the report names it
    segments: tuple[int, ...]  # the segments of this run that ran it
    step_s: float | None  # theirs pooled: the slowest rank's mean, weighted by measured steps; None: not run
    published: tuple[float | None, ...]  # each source's seconds per step (None: that source has no such row)


@dataclass(frozen=True)
class Comparison:
    run: str
    sources: tuple[str, ...]
    rows: tuple[Row, ...]

    def speedups(self, values: list[float | None]) -> list[float | None]:
        """Each value as speedup over the first row's (a step time: first / value)."""
        base = values[0]
        return [base / v if base and v else None for v in values]

    def order(self, values: list[float | None]) -> list[str]:
        """The rows that have a value, slowest first."""
        known = [(v, r.name) for v, r in zip(values, self.rows) if v is not None]
        return [name for _, name in sorted(known, key=lambda p: -p[0])]


def load(profile: str) -> list[Reference]:
    """The references of a recording's profile; a malformed table is said once on stderr and left out."""
    try:
        return profile_references(profile)
    except UsageError as exc:
        print(f"ddptop report: published figures left out: {exc}", file=sys.stderr)
        return []


def matches(s: SegmentStats, match: tuple) -> bool:
    return all(getattr(s.config, key) == value for key, value in match)


def compare(run: str, refs: list[Reference], stats: list[SegmentStats]) -> Comparison | None:
    """One row per configuration any source names (in the order they first name them)."""
    keys: list[tuple] = []
    for ref in refs:
        keys += [m for m, _ in ref.rows if m not in keys]
    rows = []
    for key in keys:
        mine = [s for s in stats if matches(s, key)]
        names = {s.config.describe() for s in mine}
        name = names.pop() if len(names) == 1 else " ".join(f"{k}={v}" for k, v in key)
        rows.append(Row(name, tuple(s.index for s in mine), pooled(mine, "mean_step_s") if mine else None,
                        tuple(next((v for m, v in ref.rows if m == key), None) for ref in refs)))
    if not any(r.step_s is not None for r in rows):
        return None
    return Comparison(run, tuple(ref.source for ref in refs), tuple(rows))


def _x(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}×"


def _s(value: float | None) -> str:
    return "–" if value is None else f"{value:.4g}"


def blocks(c: Comparison) -> list[tuple]:
    """The table (this run, then each source: s/step and speedup over the first row) and how the orders compare."""
    first = c.rows[0].name
    header = ["configuration", "segments", "this run: s/step", f"this run: speedup over {first}"]
    columns = [[r.step_s for r in c.rows]]
    for i in range(len(c.sources)):
        header += [f"[{i + 1}]: s/step", f"[{i + 1}]: speedup"]
        columns.append([r.published[i] for r in c.rows])
    speed = [c.speedups(col) for col in columns]
    table = [[untrusted(r.name), ", ".join(map(str, r.segments)) or "not run"]
             + [cell for col, sp in zip(columns, speed) for cell in (_s(col[j]), _x(sp[j]))]
             for j, r in enumerate(c.rows)]
    notes = [f"[{i}] {untrusted(source)}" for i, source in enumerate(c.sources, 1)]
    return [("table", header, table), ("list", notes), ("p", untrusted(order_finding(c), None))]


def order_finding(c: Comparison) -> str:
    mine = c.order([r.step_s for r in c.rows])
    text = "Slowest to fastest, this run: " + " > ".join(mine)
    for i, source in enumerate(c.sources):
        theirs = c.order([r.published[i] for r in c.rows])
        both = [n for n in mine if n in theirs]
        same = both == [n for n in theirs if n in both]
        text += f"; [{i + 1}]: " + (" > ".join(theirs) if not same else "the same order" + (
            "" if both == theirs == mine else f" over the {len(both)} both have"))
    return text + "."


def short(source: str, limit: int = 40) -> str:
    """A source's name for a legend: up to its first comma or bracket, at most `limit` characters (the page has
    it whole)."""
    head = re.split(r"[,(]", source)[0].strip()
    return head if len(head) <= limit else head[:limit - 1].rstrip() + "…"


def figure(c: Comparison, out: Path, name: str = "reference") -> Made:
    """Speedup over the first row, this run beside each source, one group per configuration."""
    series = [("this run", [r.step_s for r in c.rows])]
    series += [(f"[{i}] {short(source)}", [r.published[i - 1] for r in c.rows])
               for i, source in enumerate(c.sources, 1)]
    fig, (ax,) = plot.figure(width=max(9.0, 1.6 * len(c.rows) + 5), height=3.8)
    offsets, w = _offsets(len(series))
    x = list(range(len(c.rows)))
    values = []
    for j, (label, steps) in enumerate(series):
        sp = [v if v is not None else float("nan") for v in c.speedups(steps)]
        values += [v for v in sp if v == v]
        plot.bars(ax, [i + offsets[j] for i in x], sp, width=w, label=label, color=plot.color(j))
        for i, v in zip(x, sp):
            if v == v:
                ax.annotate(f"{v:.2f}×", (i + offsets[j], v), textcoords="offset points", xytext=(0, 2),
                            ha="center", va="bottom", fontsize=7)
    plot.categories(ax, [r.name for r in c.rows])
    ax.set_ylim(0, max(values, default=1.0) * 1.15)
    ax.set_ylabel("speedup over the first, ×")
    ax.set_title(f"speedup over {c.rows[0].name}: its seconds per step / each configuration's", fontsize=9)
    plot.legend_outside(ax)
    data = plot.save(fig, out, name, "Beside the published figures")
    mine = c.speedups([r.step_s for r in c.rows])
    text = order_finding(c) + " Speedup over " + c.rows[0].name + ": this run " + ", ".join(
        f"{r.name} {_x(v)}" for r, v in zip(c.rows[1:], mine[1:]))
    for i in range(len(c.sources)):
        theirs = c.speedups([r.published[i] for r in c.rows])
        text += f"; [{i + 1}] " + ", ".join(_x(v) for v in theirs[1:])
    return Made(name, "Beside the published figures", data, text + ".")
