"""Provides the ranks table (latest step and a rolling mean, by ddptop.metrics), the per-segment table (the same cells
as `ddptop info`) and the per-rank utilization rows."""

from __future__ import annotations

import dataclasses
import math

from rich.table import Table
from rich.text import Text

from ddptop import metrics
from ddptop.metrics import tables
from ddptop.state.session import Snapshot
from ddptop.state.snapshot import RECENT_STEPS
from ddptop.tui.render.palette import STATES, part_style
from ddptop.tui.render.spark import pct_bar, sparkline
from ddptop.safe import clean
from ddptop.tui.render.units import fmt_bytes, fmt_s

STATE_STYLES = STATES
WIDE = 120  # from this width on, tables show every column


def _table() -> Table:
    return Table(box=None, padding=(0, 1), header_style="bold reverse", pad_edge=False)


def ranks_table(snap: Snapshot, selected: int | None = None, width: int = 160, window: int = RECENT_STEPS,
                only=None) -> Table:
    """One row per rank (of `only`, when given: a node's or one rank's detail): the latest step time, then means over its last `window` steps (sampled steps left out):
    step time, img/s, comm share, exposed comm, overlap, ddptop's own cost; loss, CPU, GPU. Paused, rates say so.

    The slowest running rank's row carries `◀ slowest`; the selected rank is underlined."""
    table = _table()
    wide = width >= WIDE
    columns = [("rank", "right"), ("host", "left"), ("state", "left"), ("step", "right"), ("s/step", "right"),
               (f"mean{window}", "right"), (rate_unit(snap), "right"), ("comm", "right"), ("exposed", "right"),
               ("overlap", "right"), ("ddptop", "right"), ("loss", "right"), ("CPU%", "right"), ("GPU%", "right")]
    energy = any(r.energy is not None for r in snap.ranks)
    columns += [("J/step", "right"), ("J/sample", "right"), ("comm J", "right")] if energy else []
    keep = [i for i, (name, _) in enumerate(columns)
            if wide or name not in ("host", "img/s", "samples/s", "overlap", "CPU%", "GPU%", "J/sample")]
    for i in keep:
        table.add_column(columns[i][0], justify=columns[i][1], no_wrap=True)
    for r in snap.ranks:
        if only is not None and r.rank not in only:
            continue
        cells = _rank_cells(snap, r, window, wide) + (_energy_cells(r) if energy else [])
        table.add_row(*[c for i, c in enumerate(cells) if i in keep],
                      style=(("underline" if r.rank == selected else "") or None))
    return table


def rate_unit(snap: Snapshot) -> str:
    """img/s or samples/s, by the run's data set (metrics.rate_unit)."""
    return metrics.rate_unit(getattr(snap.run, "dataset", None))


def _rank_cells(snap: Snapshot, r, window: int, wide: bool = True) -> list:
    last, f = r.last, snap.recent(r.rank, window)
    state = Text(r.state, style=STATES.get(r.state, ""))
    if r.slowest:
        state.append(" ◀ slowest" if wide else " ◀", style="bold")
    if last is None:
        return [str(r.rank), clean(r.host), state, "0", "-", "-", "-", "-", "-", "-", "-", "-", _cpu(r), _gpu(r)]
    rate = "paused" if snap.paused and r.state != "lost" else f"{f.images_per_s:.0f}"
    own = (f"{fmt_s(f.own_s)} {f.share(f.own_s):.1%}" if wide else f"{f.share(f.own_s):.1%}") \
        if f.steps and f.own_s > 0 else "-"  # 0: a file from before ddptop measured its own cost
    if wide and f.steps and f.threads_s > 0:  # its other threads' CPU per step (issue 42; older files: 0)
        own += f" +{fmt_s(f.threads_s)}"
    return [str(r.rank), clean(r.host), state, str(r.step), fmt_s(last.iter_s) + ("*" if last.sampled else ""),
            fmt_s(f.step_s) if f.steps else "-", rate, f"{f.share(f.comm_s):.0%}", fmt_s(f.exposed_comm_s),
            f"{f.overlap:.0%}", own, _loss(last.loss), _cpu(r), _gpu(r)]


def _energy_cells(r) -> list[str]:
    """Joules per step, per sample, and spent waiting in exposed communication per step (metrics.energy)."""
    e = r.energy
    if e is None:
        return ["-", "-", "-"]
    return [f"{e.j_per_step:.3g}", f"{e.j_per_sample:.3g}", f"{e.comm_j_per_step:.3g}"]


def _cpu(r) -> str:
    return f"{r.system.proc_cpu_percent:.0f}" if r.system else "-"


def _gpu(r) -> str:
    return "-" if r.gpu_percent is None else f"{r.gpu_percent:.0f}"


def _loss(value: float) -> str:
    return "nan" if math.isnan(value) else f"{value:.4f}"


SEGMENT_NARROW = ("#", "config", "s/step slowest", "img/s", "comm", "exposed", "overlap")
NARROW_NAMES = {"s/step slowest": "s/step"}  # narrow: the slowest rank's, as the wide table says


def segment_table(snap: Snapshot, width: int = 160, last: int | None = None) -> Table:
    """The per-segment comparison from snap.segment_figures, with `ddptop info`'s cells (ddptop.metrics.tables); the
    segment in force is marked ▶, one still in its warm-up says so; `last` keeps the newest segments only."""
    table = _table()
    wide = width >= WIDE
    header = list(tables.header(rate_unit(snap)))
    keep = [i for i, name in enumerate(header) if wide or name in SEGMENT_NARROW or name == "samples/s"]
    for i in keep:
        table.add_column(header[i] if wide else NARROW_NAMES.get(header[i], header[i]), no_wrap=True,
                         justify="left" if header[i] == "config" else "right", min_width=2 if i == 0 else None)
    segments = list(snap.segment_figures)[-last:] if last else list(snap.segment_figures)
    for seg, row in zip(segments, metrics.table_rows(segments)):
        cells = list(tables.cells(row))
        cells[2] = clean(cells[2] if wide else short_config(cells[2]))
        if seg.measured_steps == 0:  # still in its warm-up: no figure yet rather than zeros
            cells = cells[:3] + [f"warm-up ({row['warmup']} step{'s' if row['warmup'] != 1 else ''})"] + \
                ["" for _ in cells[4:]]
        current = seg.index == snap.segment and not snap.finished
        cells[0] = ("▶" if current else " ") + cells[0]
        table.add_row(*[c for i, c in enumerate(cells) if i in keep], style="bold" if current else None)
    return table


def short_config(text: str) -> str:
    """`ddp bucket=0.02MB batch=16 lr=0.05` → `ddp 0.02MB b16 lr 0.05`, for 80 columns."""
    return text.replace("bucket=", "").replace(" batch=", " b").replace(" lr=", " lr ")


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
        out.append(f"{clean(r.host)[:10]:<11}")
        out.append("CPU ")
        out.append_text(pct_bar(s.proc_cpu_percent if s else None, 18, style=part_style("optimizer")))
        out.append(" ")
        out.append_text(sparkline(hist.cpu if hist else (), spark, top=100.0, style=part_style("optimizer")))
        out.append(f"  mem {fmt_bytes(s.proc_rss_bytes if s else None):>9} ")
        out.append_text(sparkline(hist.rss if hist else (), spark, style=part_style("forward")))
        out.append("  ")
        out.append_text(gpu_text(r, hist))
    if not snap.ranks:
        out.append("waiting for the ranks' first system samples", style="dim")
    statuses = sorted({clean(r.system.gpu_status) for r in snap.ranks if r.system and not r.system.gpus})
    if statuses:
        out.append(f"\nGPU: {'; '.join(statuses)}", style="dim")
    return out


def energy_note(snap: Snapshot) -> Text:
    """Once, under the ranks: where the energy figures come from and how often they are read; empty where no rank
    has any (no column either: never zeros)."""
    shown = [r.energy for r in snap.ranks if r.energy is not None]
    if not shown:
        return Text("")
    sources = sorted({e.source for e in shown})
    period = max(e.period_s for e in shown)
    read = f", read every {period:.2g} s" if period > 0 else ""
    return Text(f"energy: {'; '.join(sources)}{read}; comm J: mean power × exposed communication, an upper "
                "bound", style="dim")


def gpu_text(r, hist, spark: int = 8) -> Text:
    """Whatever the rank's GpuStat carries (utilization, memory, power, temperature, …); `GPU -` without one."""
    gpus = r.system.gpus if r.system else ()
    if not gpus:
        return Text("GPU -", style="dim")
    g = gpus[0]
    out = Text("GPU ")
    out.append_text(pct_bar(g.util_percent, 12, style=part_style("ddptop")))
    out.append_text(sparkline(hist.gpu if hist else (), spark, top=100.0, style=part_style("ddptop")))
    for f in dataclasses.fields(g):
        value = getattr(g, f.name)
        if f.name not in GPU_SKIP and isinstance(value, (int, float)) and not isinstance(value, bool):
            out.append(" " + gpu_value(f.name, value, g))
    if len(gpus) > 1:
        out.append(f" (+{len(gpus) - 1} GPU{'s' if len(gpus) > 2 else ''})", style="dim")
    return out


# shown otherwise (the bar; with the memory used); the energy counter as joules per step (metrics.energy)
GPU_SKIP = {"index", "util_percent", "mem_total_bytes", "energy_j"}


def gpu_value(name: str, value: float, g) -> str:
    """A GpuStat field by its unit suffix, so fields a newer GpuStat adds show without a change here."""
    if name == "mem_used_bytes":
        return f"mem {fmt_bytes(value, 0)}/{fmt_bytes(getattr(g, 'mem_total_bytes', None), 0)}"
    label = name.rsplit("_", 1)[0] if "_" in name else name
    for suffix, fmt in (("_bytes_s", lambda v: f"{fmt_bytes(v)}/s"), ("_bps", lambda v: f"{fmt_bytes(v)}/s"),
                        ("_bytes", lambda v: fmt_bytes(v, 0)), ("_percent", lambda v: f"{v:.0f}%"),
                        ("_w", lambda v: f"{v:.0f} W"), ("_c", lambda v: f"{v:.0f}°C"), ("_mhz", lambda v: f"{v:.0f} MHz")):
        if name.endswith(suffix):
            label = name[: -len(suffix)].replace("_", " ")
            return f"{label} {fmt(value)}"
    return f"{label.replace('_', ' ')} {value:g}"


def node_memory_line(snap: Snapshot) -> Text:
    """Node CPU and memory per host: used / total as bars."""
    out = Text()
    seen = set()
    for r in snap.ranks:
        s = r.system
        if not s or s.host in seen:
            continue
        seen.add(s.host)
        pct = 100.0 * s.node_mem_used_bytes / s.node_mem_total_bytes if s.node_mem_total_bytes else None
        # in a CPU quota cgroup (a lab node) the share is of that quota, not of the machine: it says so
        quota = "" if s.node_cpu_quota is None else f"(of its {s.node_cpu_quota:.2g}-core quota) "
        out.append(f"{clean(s.host)[:14]:<15}node CPU {quota}")
        out.append_text(pct_bar(s.node_cpu_percent, 14, style=part_style("optimizer")))
        out.append(" mem ")
        out.append_text(pct_bar(pct, 14, style=part_style("forward"),
                                label=f"{fmt_bytes(s.node_mem_used_bytes, 0)}/{fmt_bytes(s.node_mem_total_bytes, 0)}"))
        out.append("\n")
    out.rstrip()
    return out


MEASURED_BY = {"cuda allocator": "CUDA allocator", "process USS": "unique memory (USS)",
             "process statm": "anonymous memory (statm)"}


def memory_table(snap: Snapshot, width: int = 160) -> Table | None:
    """Each rank's memory by kind in the newest segment sampled (metrics.memory): parameters, gradients and optimizer
    state in its own storage, and the peak; wide, also their sum, the latest value and a GPU's reserved bytes. None
    before the first sample (and for a recording from before issue 43)."""
    if not snap.memory:
        return None
    wide = width >= WIDE
    cuda = any(m.by == "cuda allocator" for m in snap.memory)
    columns = ["rank", "params", "grads", "optimizer", "peak"]
    if wide:
        columns[4:4] = ["held"]
        columns += ["now"] + (["reserved"] if cuda else []) + ["step", "measured by"]
    table = _table()
    for name in columns:
        table.add_column(name, justify="left" if name == "measured by" else "right", no_wrap=True)
    for m in snap.memory:
        cells = {"rank": str(m.rank), "params": fmt_bytes(m.param_bytes), "grads": fmt_bytes(m.grad_bytes),
                 "optimizer": fmt_bytes(m.optim_bytes), "held": fmt_bytes(m.held_bytes),
                 "peak": fmt_bytes(m.peak_bytes), "now": fmt_bytes(m.now_bytes),
                 "reserved": fmt_bytes(m.reserved_bytes), "step": str(m.step),
                 "measured by": MEASURED_BY.get(m.by, clean(m.by))}
        table.add_row(*[cells[name] for name in columns])
    return table
