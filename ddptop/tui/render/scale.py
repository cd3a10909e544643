"""Provides the many-ranks renderables: the spread table, the top k by score, the rank × step heatmap (state.scale)."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text

from ddptop.metrics.ranks import FIGURES, HEAT_LEVELS, STATS, heat_level
from ddptop.safe import clean
from ddptop.state.scale import Heat, ScaleView, figure_of
from ddptop.tui.render import palette
from ddptop.tui.render.cells import styled_runs
from ddptop.tui.render.units import fmt_s

LABEL = 18  # columns of a heatmap row's label (host and its ranks)


def _table() -> Table:
    return Table(box=None, padding=(0, 1), header_style="bold reverse", pad_edge=False)


def host_of(snap, rank: int | None) -> str:
    return next((clean(r.host) for r in snap.ranks if r.rank == rank), "?")


def spread_table(snap, view: ScaleView, wide: bool = True, figures=FIGURES) -> Table:
    """One row per figure (metrics.ranks.FIGURES): median, p90 and worst over ranks, and which rank is the worst."""
    table = _table()
    table.add_column("over ranks" if wide else "figure", no_wrap=True)
    for stat in STATS:
        table.add_column(stat, justify="right", no_wrap=True)
    table.add_column("worst rank", no_wrap=True)
    for name in figures:
        values = view.spreads.get(name) or {}
        rank = view.worst.get(name)
        table.add_row(name, *(fmt_s(values[s]) if s in values else "-" for s in STATS),
                      f"r{rank} {host_of(snap, rank)}" if rank is not None else "-")
    return table


def top_table(snap, view: ScaleView, k: int, selected: int | None, wide: bool = True) -> Table:
    """The k ranks of lowest score (the slowest by busy time against the median), their node, state and figures."""
    table = _table()
    names = list(FIGURES) if wide else ["step", "busy", "exposed comm"]
    for name, justify in (("rank", "right"), ("node", "left"), ("score", "right"), *((n, "right") for n in names)):
        table.add_column(name if name != "exposed comm" or wide else "exposed", justify=justify, no_wrap=True)
    states = {r.rank: r.state for r in snap.ranks}
    for rank in view.top(k):
        f = view.by_rank[rank]
        node = host_of(snap, rank) + ("" if states.get(rank) in ("running", None) or not wide else
                                      f" ({states[rank]})")
        table.add_row(str(rank), node, f"{view.scores[rank]:.2f}", *(fmt_s(figure_of(f, n)) for n in names),
                      style="underline" if rank == selected else None)
    return table


def heat_legend(figure: str, short: bool = False) -> Text:
    """What a cell's glyph and colour say; `short`: one line of 80 columns, with the key that changes the figure."""
    out = Text(f"{figure} per step vs the median cell: " if short else
               f"{figure} per step, against the median cell: ", style="bold" if short else "dim")
    bounds = (f"<{HEAT_LEVELS[0]:g}×",) + tuple(f"≥{b:g}×" for b in HEAT_LEVELS)
    for (style, glyph), text in zip(palette.HEAT, bounds):
        out.append(glyph * (1 if short else 2), style=style)
        out.append(f"{text} " if short else f" {text}  ", style="dim")
    if short:
        out.append("(h)", style="dim")
    return out


def heatmap(heat: Heat, width: int, label: int = LABEL) -> Text:
    """Each row: its label, then a cell per step (the newest at the right), glyph and colour by heat_level."""
    out = Text()
    columns = max(1, width - label - 1)
    for i, (name, row) in enumerate(zip(heat.labels, heat.cells)):
        if i:
            out.append("\n")
        cells = ((" ", "") if value is None else palette.HEAT[heat_level(value, heat.middle)][::-1]
                 for value in row[-columns:])  # (glyph, colour): a span per run of one colour, not per cell
        out.append_text(styled_runs(cells, Text().append(f"{clean(name)[:label]:<{label}} ", style="bold")))
    return out


def step_axis(heat: Heat, width: int, label: int = LABEL) -> Text:
    """The steps under the heatmap: the first shown at the left, the newest at the right."""
    columns = min(max(1, width - label - 1), len(heat.cells[0]) if heat.cells else 0)
    last = heat.first + (len(heat.cells[0]) if heat.cells else 0) - 1
    left, right = f"step {last - columns + 1}", f"{last}"
    return Text(" " * (label + 1) + left + right.rjust(max(1, columns - len(left))), style="dim")


def node_scores(snap, view: ScaleView) -> dict[str, tuple[float, int]]:
    """host → (the lowest score among its ranks, that rank): a node is as slow as its slowest rank."""
    out: dict[str, tuple[float, int]] = {}
    for r in snap.ranks:
        if r.rank in view.scores:
            mine = (view.scores[r.rank], r.rank)
            out[r.host] = min(out.get(r.host, mine), mine)
    return out


def nodes_summary(snap, view: ScaleView, k: int, width: int) -> Text:
    """Many nodes: median, p90 and largest of the job interfaces' RX and TX rates over nodes (metrics.ranks.spread),
    then the k nodes holding the lowest-scored ranks, each with its interface's line and its ranks' lowest score."""
    from ddptop.metrics.ranks import spread
    from ddptop.state.scale import node_groups, rank_span
    from ddptop.tui.render.slurm import nic_summary_line
    from ddptop.tui.render.units import fmt_rate

    nics = {n.host: n.nic() for n in snap.nodes if n.nic() is not None}
    out = Text(f"all {len(snap.nodes)} nodes (their job interfaces), over nodes", style="bold")
    for name, attr in (("RX", "rx_rate"), ("TX", "tx_rate")):
        values = spread(getattr(nic.stat, attr) for nic in nics.values())
        if values:
            out.append(f"\n  {name}  " + "  ".join(f"{s} {fmt_rate(values[s])}" for s in ("median", "p90")) +
                       f"  largest {fmt_rate(values['worst'])}")
    scores = node_scores(snap, view)
    ranks = dict(node_groups(snap))
    worst_first = sorted(scores, key=lambda h: scores[h])[:k]
    out.append(f"\nthe {len(worst_first)} nodes holding the lowest-scored ranks (enter: the node shown)\n", style="bold")
    lines = []
    for host in worst_first:
        score, rank = scores[host]
        nic = nics.get(host)
        tail = f"  {rank_span(ranks.get(host, ()))} lowest {score:.2f} (r{rank})"
        line = nic_summary_line(host, nic.stat, max(20, width - len(tail))) if nic else f"{clean(host):<14.14} -"
        lines.append(line + tail)
    out.append("\n".join(lines))
    return out
