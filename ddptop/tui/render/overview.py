"""Provides the overview: the whole run on one screen (ranks, where a step's time goes, the per-segment comparison,
loss and step time with segment markers, comm share, network and utilization), and a reduced layout for 80 columns.

Every number comes from the snapshot (ddptop.metrics through SessionState): nothing is computed here but layout.
"""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from ddptop.metrics.ranks import SCALE_RANKS
from ddptop.state.scale import scale_view
from ddptop.state.session import Snapshot
from ddptop.state.snapshot import RECENT_STEPS
from ddptop.tui.render.breakdown import OTHER_NOTE, breakdown_bar, breakdown_legend
from ddptop.tui.render import palette
from ddptop.tui.render.palette import VERMILLION, part_style
from ddptop.tui.render.plot import Marker, Series, line_plot
from ddptop.tui.render.scale import spread_table, top_table
from ddptop.tui.render.slurm import expected_line, slurm_graph
from ddptop.tui.render.spark import sparkline
from ddptop.tui.render.tables import WIDE, gpu_text, ranks_table, segment_table
from ddptop.safe import clean
from ddptop.tui.render.units import fmt_bytes, fmt_rate, fmt_s
from ddptop.tui.render.whatif import whatif_line

PLOT_ROWS = 6
BARS = 4  # ranks with a breakdown bar of their own; more ranks show the slowest and the fastest
TOP = 3  # from SCALE_RANKS ranks: the ranks of lowest score the overview lists (the Ranks panel has them all)
NODES = 4  # from SCALE_RANKS ranks: the nodes with a network graph (those of the lowest scores)


def markers(snap: Snapshot) -> list[Marker]:
    return [Marker(s.step, f"{s.index} {s.label()}") for s in snap.segments if s.who != "start" or s.index > 0]


def overview(snap: Snapshot, width: int, banner: str = "", hidden: frozenset[str] = frozenset()) -> Group:
    """The overview at `width` columns: two columns of plots from WIDE on, sparklines below it. `hidden`: sections
    the user turned off (tui.prefs.SECTIONS' keys); the warnings always show."""
    parts: list[RenderableType] = []
    if banner:
        parts += [Text(banner, style="bold"), Text("")]
    parts += warnings(snap)
    if not snap.ranks:
        return Group(*parts, Text("waiting for the ranks to join", style="dim"))
    wide = width >= WIDE
    parts += [] if "hints" in hidden else [hint_line(snap, width)]
    ranks = [] if "ranks" in hidden else many_ranks(snap, width, wide) if many(snap) else [
        _title("ranks", f"latest step, then means over each rank's last {RECENT_STEPS} steps "
                        "(* a sampled step: layer hooks slow it, means leave it out)", width),
        ranks_table(snap, width=width), Text("")]
    time = [] if "time" in hidden else [_title("where a step's time goes", f"mean of the last {RECENT_STEPS} steps, by rank", width),
            time_bars(snap, width), Text("")]
    segments = [] if "segments" in hidden else [_title("segments", "as `ddptop info` shows them: " + short_note(snap), width),
                segment_table(snap, width, last=None if wide else 4), Text("")]
    if wide:
        return Group(*parts, *ranks, *time, *segments, _columns(snap, width, hidden))
    return Group(*parts, *ranks, *segments, *time, *_narrow(snap, width, hidden))


def many(snap: Snapshot) -> bool:
    """From SCALE_RANKS ranks the overview summarizes, as the Ranks and Network panels do."""
    return len(snap.ranks) >= SCALE_RANKS


def many_ranks(snap: Snapshot, width: int, wide: bool) -> list[RenderableType]:
    """Each figure's median, p90 and worst over ranks, then the TOP ranks of lowest score (state.scale)."""
    view = scale_view(snap)
    nodes = len({r.host for r in snap.ranks})
    figures = ["step", "busy", "exposed comm"]
    return [_title("ranks", f"{len(snap.ranks)} on {nodes} node{'s' if nodes != 1 else ''}: means over each rank's "
                            f"last {RECENT_STEPS} steps; score = median busy / its busy; 2: every rank", width),
            spread_table(snap, view, wide, figures),
            Text(f"the {TOP} lowest scores", style="bold"), top_table(snap, view, TOP, None, wide), Text("")]


def hint_line(snap: Snapshot, width: int) -> Text:
    """The segment in force's hints (ddptop.metrics.hints through the snapshot) on one line, cut to `width`."""
    found, best = snap.hints, whatif_line(snap)
    out = Text("hints  ", style="bold", no_wrap=True, overflow="ellipsis")
    if best:  # the What-if panel's best configuration first: it is there whenever the model fits
        out.append(best + (" · " if found else ""), style=palette.SKY)
    if found:
        out.append(" · ".join(clean(h.text) for h in found), style=palette.ORANGE)
    elif not best:
        out.append(f"none for segment {snap.segment}" if snap.segment_figures else "none yet", style="dim")
    out.truncate(width, overflow="ellipsis")
    return out


def short_note(snap: Snapshot) -> str:
    """Which steps the segment table counts, in one line (`ddptop info` says it at length)."""
    segments = snap.segment_figures
    if not segments:
        return ""
    warmup, left = segments[0].warmup, sum(s.sampled_left_out for s in segments)
    return (f"each one's first {warmup} step{'s' if warmup != 1 else ''}"
            f"{f' and {left} sampled steps' if left else ''} left out; s/step: slowest rank and mean over ranks, "
            "the rest: means over ranks")


def warnings(snap: Snapshot) -> list[Text]:
    """What must never scroll out of sight: models that diverged, ranks lost, a straggler."""
    out = [Text(f"⚠ {clean(d.describe())}", style=f"bold {VERMILLION}") for d in snap.diverged[-2:]]
    lost = [r.rank for r in snap.ranks if r.state == "lost"]
    if lost:
        out.append(Text(f"⚠ rank{'s' if len(lost) > 1 else ''} {', '.join(map(str, lost))} lost", style=f"bold {VERMILLION}"))
    if snap.straggler:  # README: Stragglers
        out.append(Text(f"straggler: {clean(snap.straggler)}", style=f"bold {palette.ORANGE}"))
    return out


def _title(name: str, note: str, width: int = 0) -> Text:
    """A section's name and what it shows, on one line (the note is cut to `width`)."""
    out = Text(name, style="bold", no_wrap=True, overflow="ellipsis")
    if note:
        out.append(f"  {note}", style="dim")
    if width and out.cell_len > width:
        out.truncate(width, overflow="ellipsis")
    return out


def time_bars(snap: Snapshot, width: int) -> Text:
    """One bar per rank (metrics.mean_parts of its recent steps) on one time scale, then one legend."""
    ranks = [r for r in snap.ranks if r.last]
    if not ranks:
        return Text("no step yet", style="dim")
    if len(ranks) > BARS:
        by_time = sorted(ranks, key=lambda r: snap.recent(r.rank).step_s)
        ranks = [by_time[-1], by_time[0]]
    parts = {r.rank: snap.recent_parts(r.rank) for r in ranks}
    scale = max(sum(p.values()) for p in parts.values())
    bar_width = max(10, width - 16)
    out = Text()
    for r in ranks:
        out.append(f"r{r.rank:<3}", style="bold")
        out.append_text(breakdown_bar(parts[r.rank], bar_width, legend=False, scale=scale))
        out.append(f" {fmt_s(sum(parts[r.rank].values()))}\n")
    slowest = max(parts, key=lambda k: sum(parts[k].values()))
    out.append("    ")
    note = OTHER_NOTE.replace("other: ", "other = ") if width >= WIDE else "other = zero_grad, Python between phases"
    out.append_text(breakdown_legend(parts[slowest], width, indent="    ", note=note))
    return out


def _series(snap: Snapshot) -> dict[str, list[Series]]:
    step_mean = snap.per_step(lambda d: d.iter_s)
    step_max = snap.per_step(lambda d: d.iter_s, reduce=max)
    comm = snap.per_step(lambda d: 100 * d.comm_s / d.iter_s if d.iter_s > 0 else 0.0)
    exposed = snap.per_step(lambda d: 100 * d.exposed_comm_s / d.iter_s if d.iter_s > 0 else 0.0)
    return {"loss": [Series("mean", palette.SKY, snap.mean_loss())],
            "step time": [Series("slowest", palette.ORANGE, step_max), Series("mean", palette.SKY, step_mean)],
            "comm": [Series("comm", palette.ORANGE, comm), Series("exposed", VERMILLION, exposed)]}


def _plot(title: str, note: str, series: list[Series], snap: Snapshot, width: int, **kw) -> Text:
    out = _title(title, note)
    out.append("\n")
    out.append_text(line_plot(series, markers(snap), width, PLOT_ROWS, x_range=_x_range(snap), **kw))
    return out


def _x_range(snap: Snapshot) -> tuple[float, float]:
    first = min((h[0].step for h in snap.history.values() if h), default=0)
    return first, max([first + 1, snap.step - 1] + [m.x for m in markers(snap)])


def _columns(snap: Snapshot, width: int, hidden: frozenset[str] = frozenset()) -> Table | Text:
    """The plots, network and utilization in two columns (the first half of what is shown on the left)."""
    half = (width - 3) // 2
    blocks: list[list[RenderableType]] = []
    if "trends" not in hidden:
        series = _series(snap)
        blocks += [[_plot("loss", "mean over ranks  ┊ a configuration change", series["loss"], snap, half)],
                   [_plot("step time", "over ranks; sampled steps left out; top at 3× the median",
                          series["step time"], snap, half, fmt=fmt_s, y_range=(0.0, step_top(series["step time"])))],
                   [_plot("communication", "% of the step: comm, and exposed (nothing hid it)", series["comm"], snap,
                          half, fmt=lambda v: f"{v:.0f}%", y_range=(0.0, 100.0))]]
    if "network" not in hidden:
        blocks.append(network(snap, half, rows=4))
    if "utilization" not in hidden:
        blocks.append(utilization(snap, half))
    if not blocks:
        return Text("")

    def column(chosen: list[list[RenderableType]]) -> Group:
        out: list[RenderableType] = []
        for block in chosen:
            out += ([Text("")] if out else []) + block
        return Group(*out)

    grid = Table.grid(padding=(0, 3))
    grid.add_column(width=half)
    grid.add_column(width=half)
    grid.add_row(column(blocks[:max(1, len(blocks) // 2)]), column(blocks[max(1, len(blocks) // 2):]))
    return grid


def step_top(series: list[Series]) -> float:
    """The step-time plot's top: 3× the median step, so a segment's slow first steps do not flatten the rest."""
    values = sorted(y for s in series for _, y in s.points)
    if not values:
        return 1.0
    return min(values[-1], 3 * values[len(values) // 2]) or 1.0


def network(snap: Snapshot, width: int, rows: int = 4) -> list[Text]:
    """Per node: a small slurm graph of its job interface (RX up, TX down) and bytes per step against the formulas."""
    out = [_title("network", "per node, its job interface: RX ▲ above the line, TX ▼ below", width)]
    strategy = str(snap.config.get("strategy", "?"))
    nodes = list(snap.nodes)
    if many(snap) and len(nodes) > NODES:  # the nodes of the lowest scores; the Network panel has them all
        order = scale_view(snap).order
        host = {r.rank: r.host for r in snap.ranks}
        first = {}
        for rank in order:
            first.setdefault(host.get(rank), len(first))
        nodes = sorted(nodes, key=lambda n: first.get(n.host, len(first)))[:NODES]
        out.append(Text(f"{len(nodes)} of {len(snap.nodes)} nodes: those of the lowest scores (3: every node)",
                        style="dim"))
    for node in nodes:
        nic = node.nic()
        head = Text(f"{clean(node.host)} ({clean(node.job_iface) or '?'})", style="bold")
        if nic is None:
            out.append(head.append("  no sample yet", style="dim"))
            continue
        head.append("  RX ", style=part_style("forward"))
        head.append(fmt_rate(nic.stat.rx_rate))
        head.append("  TX ", style=palette.ORANGE)
        head.append(fmt_rate(nic.stat.tx_rate))
        out += [head, slurm_graph(nic.rx_history, nic.tx_history, width, rows)]
        out.append(expected_line(node, node.job_iface, strategy, short=True))
    return out


def utilization(snap: Snapshot, width: int) -> list[Text]:
    """Per rank: CPU and memory histories (and the GPU's, where there is one)."""
    out = [_title("utilization", "per rank: process CPU, memory, GPU", width)]
    spark = max(6, min(30, (width - 40) // 2))
    ranks = list(snap.ranks)
    if many(snap):  # the ranks of the lowest scores; the Utilization panel has them all
        shown = set(scale_view(snap).top(TOP))
        ranks = [r for r in ranks if r.rank in shown]
        out.append(Text(f"{len(ranks)} of {len(snap.ranks)} ranks: the lowest scores (4: every rank)", style="dim"))
    for r in ranks:
        hist, s = snap.util.get(r.rank), r.system
        line = Text(f"r{r.rank:<3}", style="bold")
        line.append(f"CPU {s.proc_cpu_percent:3.0f}% " if s else "CPU   -  ")
        line.append_text(sparkline(hist.cpu if hist else (), spark, top=100.0, style=part_style("optimizer")))
        line.append(f" mem {fmt_bytes(s.proc_rss_bytes if s else None, 0):>6} ")
        line.append_text(sparkline(hist.rss if hist else (), spark, style=part_style("forward")))
        if s is not None and s.gpus:
            line.append("\n    ")
            line.append_text(gpu_text(r, hist, spark))
        out.append(line)
    return out


def _narrow(snap: Snapshot, width: int, hidden: frozenset[str] = frozenset()) -> list[RenderableType]:
    """Below WIDE columns: sparklines for the plots, one line per node and per rank."""
    out: list[RenderableType] = [] if "trends" in hidden else _trends(snap, width)
    for name, lines in (("network", lambda: network(snap, width, rows=3)),
                        ("utilization", lambda: utilization(snap, width))):
        if name not in hidden:
            out += ([Text("")] if out else []) + lines()
    return out


def _trends(snap: Snapshot, width: int) -> list[RenderableType]:
    series = _series(snap)
    spark = max(8, width - 34)
    out = [_title("trends", f"the last {spark} steps; sampled steps left out", width)]
    for name, s, fmt in (("loss", series["loss"][0], lambda v: f"{v:.4f}"),
                         ("step time", series["step time"][1], fmt_s),
                         ("comm %", series["comm"][0], lambda v: f"{v:.0f}%"),
                         ("exposed %", series["comm"][1], lambda v: f"{v:.0f}%")):
        values = [y for _, y in s.points]
        line = Text(f"{name:<10}", style="bold")
        line.append_text(sparkline(values, spark, top=100.0 if "%" in name else None, style=s.style))
        line.append(f" {fmt(values[-1]) if values else '-'}")
        out.append(line)
    marks = markers(snap)
    if marks:
        out.append(Text("switches: " + ", ".join(f"step {m.x:.0f} → {m.label}" for m in marks[-3:]),
                        style=palette.MARKER))
    return out
