"""Provides the ranks table and the per-rank utilization rows (bars plus short histories)."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text

from ddptop.state.session import Snapshot
from ddptop.tui.render.spark import pct_bar, sparkline
from ddptop.tui.render.units import fmt_bytes, fmt_s

STATE_STYLES = {"running": "green", "paused": "yellow", "lost": "bold red", "error": "bold red", "done": "cyan",
                "stopped": "cyan", "starting": "dim"}


def ranks_table(snap: Snapshot, selected: int | None = None, width: int = 160) -> Table:
    """One row per rank: host, step, iteration time, loss, comm share, MB/s, CPU %, GPU %, state.

    The slowest running rank's row is red with a `◀ slowest` tag; the selected rank is underlined.
    """
    table = Table(box=None, padding=(0, 1), header_style="bold reverse")
    wide = width >= 100
    for name, justify in (("rank", "right"), ("host", "left"), ("step", "right"), ("iter", "right"),
                          ("loss", "right"), ("comm", "right"), ("MB/s", "right"), ("CPU%", "right"),
                          ("GPU%", "right"), ("state", "left")):
        if wide or name not in ("host", "GPU%"):
            table.add_column(name, justify=justify, no_wrap=True)
    for r in snap.ranks:
        last = r.last
        gpu = "-" if r.gpu_percent is None else f"{r.gpu_percent:.0f}"
        cpu = f"{r.system.proc_cpu_percent:.0f}" if r.system else "-"
        state = Text(r.state, style=STATE_STYLES.get(r.state, ""))
        if r.slowest:
            state.append(" ◀ slowest", style="bold red")
        cells = [str(r.rank), r.host, str(r.step), fmt_s(last.iter_s) if last else "-",
                 f"{last.loss:.4f}" if last else "-", f"{r.comm_share:.0%}" if last else "-",
                 f"{r.wire_mb_s:.1f}" if last else "-", cpu, gpu, state]
        if not wide:
            cells = [c for i, c in enumerate(cells) if i not in (1, 8)]
        style = ("red" if r.slowest else "") + (" underline" if r.rank == selected else "")
        table.add_row(*cells, style=style.strip() or None)
    return table


def util_rows(snap: Snapshot, width: int) -> Text:
    """Per rank: process CPU bar and history, memory and history, GPU utilization/memory/power or `-`."""
    out = Text()
    spark = max(4, (width - 62) // 2)
    for i, r in enumerate(snap.ranks):
        hist = snap.util.get(r.rank)
        s = r.system
        if i:
            out.append("\n")
        out.append(f"r{r.rank:<3}", style="bold")
        out.append(f"{r.host[:10]:<11}")
        out.append("CPU ")
        out.append_text(pct_bar(s.proc_cpu_percent if s else None, 18))
        out.append(" ")
        out.append_text(sparkline(hist.cpu if hist else (), spark, top=100.0, style="green"))
        out.append(f"  mem {fmt_bytes(s.proc_rss_bytes if s else None):>9} ")
        out.append_text(sparkline(hist.rss if hist else (), spark, style="blue"))
        out.append("  ")
        out.append_text(_gpu_text(r, hist))
    if not snap.ranks:
        out.append("waiting for the ranks' first system samples", style="dim")
    statuses = sorted({r.system.gpu_status for r in snap.ranks if r.system and not r.system.gpus})
    if statuses:
        out.append(f"\nGPU: {'; '.join(statuses)}", style="dim")
    return out


def _gpu_text(r, hist) -> Text:
    gpus = r.system.gpus if r.system else ()
    if not gpus:
        return Text("GPU -", style="dim")
    g = gpus[0]
    out = Text("GPU ")
    out.append_text(pct_bar(g.util_percent, 12, style="magenta"))
    out.append_text(sparkline(hist.gpu if hist else (), 8, top=100.0, style="magenta"))
    if g.mem_used_bytes is not None:
        out.append(f" {fmt_bytes(g.mem_used_bytes, 0)}/{fmt_bytes(g.mem_total_bytes, 0)}")
    if g.power_w is not None:
        out.append(f" {g.power_w:.0f} W")
    return out


def node_memory_line(snap: Snapshot) -> Text:
    """Node memory per host: used / total as a bar."""
    out = Text()
    seen = set()
    for r in snap.ranks:
        s = r.system
        if not s or s.host in seen:
            continue
        seen.add(s.host)
        pct = 100.0 * s.node_mem_used_bytes / s.node_mem_total_bytes if s.node_mem_total_bytes else None
        out.append(f"{s.host[:14]:<15}node CPU ")
        out.append_text(pct_bar(s.node_cpu_percent, 14))
        out.append(" mem ")
        out.append_text(pct_bar(pct, 14, style="blue",
                                label=f"{fmt_bytes(s.node_mem_used_bytes, 0)}/{fmt_bytes(s.node_mem_total_bytes, 0)}"))
        out.append("\n")
    out.rstrip()
    return out
