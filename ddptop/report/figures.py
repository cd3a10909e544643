"""The per-segment figures: iteration time (CS744 fig 8), the parts of a step, bytes per step, CPU and memory
(figs 1-2). Each returns a `Made`: the files, the values read back from the drawn figure, and what it shows."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ddptop import metrics
from ddptop.report import plot
from ddptop.report.analysis import PARTS, SegmentStats


@dataclass(frozen=True)
class Made:
    name: str  # file stem: NAME.png, NAME.svg, NAME.pdf
    title: str
    data: dict[str, Any]  # plot.save's readback
    finding: str  # "what this shows", computed from the values drawn


def _offsets(k: int, width: float = 0.8) -> tuple[list[float], float]:
    w = width / max(k, 1)
    return [(j - (k - 1) / 2) * w for j in range(k)], w


def step_time(stats: list[SegmentStats], names: list[str], out: Path, subtitle: str) -> Made:
    fig, (ax,) = plot.figure(width=max(6.5, 1.2 * len(stats) + 3))
    x = list(range(len(stats)))
    means = [s.mean_step_s for s in stats]
    kinds = [(s.label, s.config.describe()) for s in stats]
    first = list(dict.fromkeys(kinds))  # a configuration run in several segments (rounds) keeps one colour
    plot.bars(ax, x, means, color=[plot.color(first.index(k)) for k in kinds], lo=[s.step_p10 for s in stats],
              hi=[s.step_p90 for s in stats], label="mean (slowest rank)")
    plot.categories(ax, names)
    plot.value_axis(ax, means + [s.step_p10 for s in stats] + [s.step_p90 for s in stats], "seconds per step")
    top = max(max(s.step_p90, s.mean_step_s) for s in stats)
    ax.set_ylim(top=top * (1.6 if ax.get_yscale() == "log" else 1.12))  # room for the labels over the whiskers
    for i, s in enumerate(stats):
        ax.annotate(f"{s.mean_step_s:.3g} s", (i, max(s.step_p90, s.mean_step_s)), textcoords="offset points",
                    xytext=(0, 3), ha="center", va="bottom", fontsize=8)
    ax.set_title(f"slowest rank's mean step time, whiskers p10–p90 of its measured steps; {subtitle}", fontsize=9)
    plot.legend_outside(ax)
    data = plot.save(fig, out, "step_time", "Iteration time per configuration")
    return Made("step_time", "Iteration time per configuration", data, _step_finding(stats, names))


def _step_finding(stats: list[SegmentStats], names: list[str]) -> str:
    pairs = sorted(zip((s.mean_step_s for s in stats), names))
    (fast, fast_name), (slow, slow_name) = pairs[0], pairs[-1]
    if len(pairs) == 1:
        s = stats[0]
        return f"{fast_name} took {fast:.3g} s per step (p10–p90 {s.step_p10:.3g}–{s.step_p90:.3g} s)."
    spread = max(zip(stats, names), key=lambda p: (p[0].step_p90 - p[0].step_p10) / p[0].mean_step_s)
    return (f"{fast_name} was fastest at {fast:.3g} s per step and {slow_name} slowest at {slow:.3g} s "
            f"({slow / fast:.2f}×); the widest spread was {spread[1]}'s, p10–p90 {spread[0].step_p10:.3g}–"
            f"{spread[0].step_p90:.3g} s.")


PART_COLORS = {"data": "#8C8C8C", "compute": "#2F4B7C", metrics.MICRO: "#E5AE38", "forward": "#4C72B0",
               "backward": "#64B5CD",
               "exposed comm": "#C44E52",
               "optimizer": "#55A868", "ddptop": "#DA8BC3", "other": "#CCB974"}


def breakdown(stats: list[SegmentStats], names: list[str], out: Path, subtitle: str) -> Made:
    """Left: the parts of a step as shares (a stacked bar cannot go logarithmic); right: communication, exposed
    and hidden under compute, in seconds."""
    fig, (a, b) = plot.figure(2, 1, width=max(9.0, 1.3 * len(stats) + 4), height=3.6)
    x = list(range(len(stats)))
    bottom = [0.0] * len(stats)
    totals = [sum(s.parts.values()) for s in stats]
    for part in PARTS:
        shares = [100 * s.parts.get(part, 0.0) / t if t > 0 else 0.0 for s, t in zip(stats, totals)]
        if not any(shares):
            continue  # a part no segment has (compute unsplit in older files, ddptop's own cost) stays off the legend
        plot.bars(a, x, shares, bottoms=bottom, label=part, color=PART_COLORS[part], width=0.6)
        bottom = [b0 + v for b0, v in zip(bottom, shares)]
    for i, t in enumerate(totals):
        a.annotate(f"{t:.3g} s", (i, 100), textcoords="offset points", xytext=(0, 2), ha="center", fontsize=8)
    plot.categories(a, names)
    a.set_ylabel("% of the step (mean over ranks)")
    a.set_ylim(0, 108)
    a.set_title("where a step's time goes (total above each bar)", fontsize=9)
    plot.legend_outside(a, reverse=True)
    offsets, w = _offsets(2)
    comm = [s.comm_s for s in stats]
    exposed = [s.exposed_comm_s for s in stats]
    plot.bars(b, [i + offsets[0] for i in x], comm, width=w, label="communication", color="#8172B3")
    plot.bars(b, [i + offsets[1] for i in x], exposed, width=w, label="exposed (nothing overlapped)", color="#C44E52")
    plot.categories(b, names)
    plot.value_axis(b, comm + exposed, "s per step\n(mean over ranks)")  # one line ran into the tick labels
    b.set_title("communication, and the part of it no compute hid", fontsize=9)
    plot.legend_outside(b)
    data = plot.save(fig, out, "breakdown", f"Compute vs communication ({subtitle})")
    return Made("breakdown", "Compute vs communication", data, _breakdown_finding(stats, names))


def _breakdown_finding(stats: list[SegmentStats], names: list[str]) -> str:
    talking = [(s, n) for s, n in zip(stats, names) if s.comm_s > 0 and s.world_size > 1]  # 1 rank: no-op collectives
    if not talking:
        return "No configuration shown communicated; compute is the whole step."
    if len(stats) == 1:
        s, n = talking[0]
        return (f"{n}: {s.exposed_comm_s * 1e3:.0f} ms of communication exposed per step "
                f"({100 * s.exposed_comm_s / s.mean_rank_step_s:.0f}% of the step); {100 * s.overlap:.0f}% of its "
                f"{s.comm_s * 1e3:.0f} ms of communication ran under compute.")
    worst = max(talking, key=lambda p: p[0].exposed_comm_s / p[0].mean_rank_step_s if p[0].mean_rank_step_s else 0)
    best = max(talking, key=lambda p: p[0].overlap)
    text = (f"{worst[1]} waited longest on communication: {worst[0].exposed_comm_s * 1e3:.0f} ms exposed per step, "
            f"{100 * worst[0].exposed_comm_s / worst[0].mean_rank_step_s:.0f}% of its step")
    if best[0].overlap > 0.05:
        text += f"; {best[1]} hid the most, {100 * best[0].overlap:.0f}% of its communication under compute"
    return text + "."


def bytes_per_step(stats: list[SegmentStats], names: list[str], out: Path, subtitle: str) -> Made:
    """Left: what each rank sends per step by the algorithm; right: what each network interface counted, with the
    formula for the ranks behind it as a black tick."""
    links = sorted({l.name for s in stats for l in s.links})
    fig, axes = plot.figure(2 if links else 1, 1, width=max(9.0, 1.4 * len(stats) + 4), height=3.4)
    a = axes[0]
    ranks = sorted({r.rank for s in stats for r in s.ranks})
    offsets, w = _offsets(len(ranks))
    x = list(range(len(stats)))
    values = []
    for j, rank in enumerate(ranks):
        sent = [next((r.sent_mb for r in s.ranks if r.rank == rank), 0.0) for s in stats]
        values += sent
        plot.bars(a, [i + offsets[j] for i in x], sent, width=w, label=f"rank {rank}", color=plot.color(j))
    plot.categories(a, names)
    plot.value_axis(a, values, "MB sent per step, formula")
    a.set_title("what each rank's algorithm sends: ring 2(N−1)/N·S, gather+scatter (N−1)·S at rank 0", fontsize=9)
    plot.legend_outside(a)
    for i, s in enumerate(stats):
        if all(r.sent_mb == 0 for r in s.ranks):
            a.annotate("0: sends nothing", (i, 0), textcoords="offset points", xytext=(0, 3), ha="center",
                       va="bottom", fontsize=8, color="#777777")
    if links:
        if _nic_panel(axes[1], stats, names, links):  # the footnote explains an n/a bar, so only where one is
            plot.note(fig, "n/a: no two network samples (every 0.5 s) fell between two steps' traffic (in a forward pass), "
                           "and the segment had too few steps to count across partial ones.")
    else:
        plot.note(fig, "No NIC panel: no segment had two network samples (taken every 0.5 s) between its steps' "
                       "traffic, or enough steps to count across partial ones, so no interface's bytes per step can "
                       "be told.")
    data = plot.save(fig, out, "bytes_per_step", f"Bytes per step ({subtitle})")
    return Made("bytes_per_step", "Bytes per step", data, _bytes_finding(stats, names))


def _nic_panel(ax, stats: list[SegmentStats], names: list[str], links: list[str]) -> bool:
    """The counted bytes per interface, the formula as a tick; True when some bar is n/a (marked so under it)."""
    offsets, w = _offsets(len(links))
    x = list(range(len(stats)))
    values = []
    missing = False
    for j, link in enumerate(links):
        found = [next((l for l in s.links if l.name == link), None) for s in stats]
        for i in (i for i, l in enumerate(found) if l is None):
            missing = True
            ax.annotate("n/a", (i + offsets[j], 0), xycoords=("data", "axes fraction"), textcoords="offset points",
                        xytext=(0, 3), ha="center", va="bottom", fontsize=7, color="#777777")
        counted = [l.sent_mb if l else float("nan") for l in found]  # nan: not measured, no bar (not a zero)
        formula = [l.formula_sent_mb if l else float("nan") for l in found]
        values += counted + formula
        plot.bars(ax, [i + offsets[j] for i in x], counted, width=w, label=f"{link}: counted", color=plot.color(j),
                  alpha=0.85)
        ax.plot([i + offsets[j] for i in x], formula, linestyle="none", marker="_", markersize=14, color="black",
                markeredgewidth=2, label="formula" if j == 0 else f"_formula {link}")
    plot.categories(ax, names)
    plot.value_axis(ax, values, "MB sent per step, counted")
    ax.set_title("what each network interface counted; tick: the formula for the ranks behind it", fontsize=9)
    plot.legend_outside(ax)
    return missing


def _nic_sent(s: SegmentStats, rank: int) -> float | None:
    return next((r.nic_sent_mb for r in s.ranks if r.rank == rank), None)


def _bytes_finding(stats: list[SegmentStats], names: list[str]) -> str:
    by: dict = {}
    for s, n in sorted(zip(stats, names), key=lambda p: _nic_sent(p[0], 0) is None):  # NIC-counted ones first
        by.setdefault(s.config.strategy + (" async" if s.config.async_op else ""), (s, n))
    text = []
    gs, ring = by.get("gather-scatter"), by.get("allreduce") or by.get("ddp")
    if gs and ring:
        top = max(gs[0].ranks, key=lambda r: r.sent_mb)
        ring_rank = max(r.sent_mb for r in ring[0].ranks)
        if ring_rank > 0:
            text.append(f"gather-scatter's rank {top.rank} sent {top.sent_mb / ring_rank:.1f}× the ring's bytes per "
                        f"step ({top.sent_mb:.3g} vs {ring_rank:.3g} MB, {ring[1]})"
                        + (": at N = 2, (N−1)·S and 2(N−1)/N·S are both S" if gs[0].world_size == 2 else ""))
            counted, ring_counted = _nic_sent(gs[0], top.rank), _nic_sent(ring[0], top.rank)
            if counted and ring_counted:
                text[-1] += (f"; its network interface counted {counted:.1f} vs {ring_counted:.1f} MB "
                             f"({counted / ring_counted:.2f}×, {gs[1]} and {ring[1]})")
    busiest = max(stats, key=lambda s: max((r.sent_mb for r in s.ranks), default=0.0))
    if not text:
        top = max(busiest.ranks, key=lambda r: r.sent_mb)
        text.append(f"the most any rank sent by the formulas was {top.sent_mb:.3g} MB per step (rank {top.rank} "
                    f"in {names[stats.index(busiest)]})")
    idle = [(l, n) for s, n in zip(stats, names) for l in s.links if l.formula_sent_mb == 0 and l.sent_mb > 0]
    if idle:
        text.append(f"{idle[0][0].iface} carried {idle[0][0].sent_mb:.3g} MB per step even in {idle[0][1]}, which "
                    "sends nothing: a loopback counts every local process (telemetry, other jobs)"
                    if idle[0][0].iface in ("lo", "lo0") else
                    f"{idle[0][0].name} carried {idle[0][0].sent_mb:.3g} MB per step even in {idle[0][1]}, which "
                    "sends nothing (telemetry, control)")
    counted = [(l, n) for s, n in zip(stats, names) for l in s.links if l.formula_sent_mb > 0]
    if counted:
        ratios = [l.sent_mb / l.formula_sent_mb for l, _ in counted]
        span = f"{min(ratios):.2f}×" if f"{min(ratios):.2f}" == f"{max(ratios):.2f}" else \
            f"{min(ratios):.2f}–{max(ratios):.2f}×"
        text.append(f"the network interfaces counted {span} the formulas "
                    "(headers, telemetry and control traffic on top)")
    text = "; ".join(text)
    return text[0].upper() + text[1:] + "."


def cpu_memory(stats: list[SegmentStats], names: list[str], out: Path, subtitle: str) -> Made:
    """CS744 figs 1-2: each rank's process CPU and resident memory per configuration, p10-p90 over samples."""
    ranks = sorted({(r.rank, r.host) for s in stats for r in s.ranks})
    fig, (a, b) = plot.figure(2, 1, width=max(9.0, 1.4 * len(stats) + 4), height=3.4)
    offsets, w = _offsets(len(ranks))
    x = list(range(len(stats)))
    for ax, field, label in ((a, "cpu", "CPU, % of one core"), (b, "rss_mb", "resident memory, MB")):
        values = []
        for j, (rank, host) in enumerate(ranks):
            spreads = [next((getattr(r, field) for r in s.ranks if r.rank == rank), None) for s in stats]
            nan = float("nan")  # no sample inside the segment: no bar, "n/a", never a zero
            mean = [sp.mean if sp else nan for sp in spreads]
            values += mean
            plot.bars(ax, [i + offsets[j] for i in x], mean, width=w, color=plot.color(j),
                      lo=[sp.p10 if sp else nan for sp in spreads], hi=[sp.p90 if sp else nan for sp in spreads],
                      label=f"rank {rank} ({host})", whisker_legend=j == len(ranks) - 1)
        plot.categories(ax, names)
        plot.value_axis(ax, values, label)
        plot.legend_outside(ax)
    a.set_title("each rank's process over the segment's measured steps (whiskers p10–p90 of the samples)", fontsize=9)
    if any(r.cpu is None for s in stats for r in s.ranks):
        plot.note(fig, "n/a: no system sample (taken every 0.5 s) fell inside that segment's measured steps.")
    data = plot.save(fig, out, "cpu_memory", f"CPU and memory per configuration ({subtitle})")
    return Made("cpu_memory", "CPU and memory per configuration", data, _cpu_finding(stats, names))


def _cpu_finding(stats: list[SegmentStats], names: list[str]) -> str:
    cpu = [(r.cpu.mean, n, r.rank) for s, n in zip(stats, names) for r in s.ranks if r.cpu]
    rss = [r.rss_mb.mean for s in stats for r in s.ranks if r.rss_mb]
    if not cpu:
        return "The recording has no system samples inside the segments shown."
    lo, hi = min(cpu), max(cpu)
    return (f"A rank's process used {lo[0]:.0f}% of a core at the least ({lo[1]}, rank {lo[2]}) and {hi[0]:.0f}% at "
            f"the most ({hi[1]}, rank {hi[2]}); resident memory stayed within {min(rss):.0f}–{max(rss):.0f} MB.")
