"""Figures over a run's course, segments shaded on one axis (never drawn as separate runs): loss and test accuracy
per step (CS744 figs 9-15), network rates and bytes per node (figs 3-4, 7, 16 and the `slurm` screens), CPU,
memory and GPU over time.

Rates over time stay on a linear axis: idle stretches read near zero, which a log axis would stretch over
most of the plot. Loss goes logarithmic when it spans more than 10× (an lr-0.1 spike to 42 would flatten the rest).
"""

from __future__ import annotations

from pathlib import Path

from ddptop.metrics.learning import first_flag
from ddptop.report import plot
from ddptop.report.analysis import SegmentStats
from ddptop.report.readings import LOOPBACK
from ddptop.report.figures import Made
from ddptop.report.runs import RunData


def _suffix(run: RunData, several: bool) -> str:
    return f"-{run.name}" if several else ""


def loss_accuracy(run: RunData, stats: list[SegmentStats], names: list[str], positions: list[int], out: Path,
                  several: bool) -> Made:
    rows = 2 if run.evals else 1
    fig, axes = plot.figure(rows, 1, width=10.0, height=3.6 if rows == 1 else 2.8, sharex=True,
                            gridspec_kw={"height_ratios": [3, 2][:rows]})
    a = axes[0]
    points = run.points
    steps = [p.step for p in points]
    a.fill_between(steps, [p.lo for p in points], [p.hi for p in points], color="#4C72B0", alpha=0.2, linewidth=0,
                   label="lowest–highest rank")
    a.plot(steps, [p.loss for p in points], color="#4C72B0", linewidth=1.2, label="mean over ranks")
    plot.value_axis(a, [p.loss for p in points], "training loss")
    spans = [(n, s.first_step - 0.5, s.last_step + 0.5, i) for s, n, i in zip(stats, names, positions)]
    plot.shade(a, spans)
    plot.legend_outside(a)
    if run.evals:
        b = axes[1]
        b.plot([e[0] for e in run.evals], [100 * e[1] for e in run.evals], marker="o", color="#55A868",
               label="test accuracy (every rank's shard)")
        b.axhline(10, color="#888888", linestyle=":", linewidth=1, label="chance (10 classes)")
        b.set_ylabel("test accuracy, %")
        b.set_ylim(0, 100)
        plot.shade(b, spans, label_top=False)
        plot.legend_outside(b)
    axes[-1].set_xlabel("step")
    if not run.evals:
        plot.note(fig, "No test accuracy: the run evaluated no epoch end (--no-eval, or it stopped before one).")
    name = f"loss{_suffix(run, several)}"
    title = f"Loss and accuracy per step{f' ({run.name})' if several else ''}"
    data = plot.save(fig, out, name, title)
    return Made(name, title, data, _loss_finding(run, stats, names))


def _loss_finding(run: RunData, stats: list[SegmentStats], names: list[str]) -> str:
    points = run.points
    first, last = points[0], points[-1]
    text = (f"The mean training loss went from {first.loss:.3g} at step {first.step} to {last.loss:.3g} at step "
            f"{last.step}")
    peak = max(points, key=lambda p: p.loss)
    if peak.loss > 1.5 * first.loss:
        text += f", peaking at {peak.loss:.3g} (step {peak.step})"
    falls = [(s.losses[0][1] - s.losses[-1][1], n) for s, n in zip(stats, names) if len(s.losses) > 1]
    if falls:
        best = max(falls)
        text += f"; it fell most during {best[1]} ({best[0]:.3g})"
    if run.evals:
        text += "; test accuracy " + ", ".join(f"{100 * acc:.0f}% at step {step}" for step, acc, _ in run.evals[:6])
    flagged = first_flag([(p.step, p.loss) for p in points])
    if flagged:
        text += f". Flagged at step {flagged[0] + 1}: the {flagged[1]}"
    return text + "."


def _links(run: RunData) -> dict[str, list]:
    """Samples per network interface: each rank's own, or one machine's shared loopback once (its lowest rank)."""
    groups: dict[tuple, list] = {}
    ranks_on: dict[tuple, set] = {}
    for s in run.samples:
        nic = s.nic()
        if nic is None:
            continue
        key = (s.host, s.job_iface) if s.job_iface in LOOPBACK else (s.rank, s.job_iface)
        ranks_on.setdefault(key, set()).add(s.rank)
        groups.setdefault(key, []).append(s)
    out = {}
    for key, samples in sorted(groups.items(), key=lambda kv: min(ranks_on[kv[0]])):
        first = min(ranks_on[key])
        mine = [s for s in samples if s.rank == first]
        if key[1] in LOOPBACK:
            out[f"{key[1]} on {key[0]} (ranks {', '.join(map(str, sorted(ranks_on[key])))}, shared)"] = mine
        else:
            out[f"rank {key[0]} {key[1]}"] = mine
    return out


def _paused(ax, run: RunData, legend: bool) -> None:
    for i, (t0, t1) in enumerate(run.pauses):
        ax.axvspan(t0 - run.start, t1 - run.start, facecolor="none", edgecolor="#AAAAAA", hatch="//", linewidth=0,
                   label="paused" if legend and i == 0 else None)


def _time_spans(run: RunData, stats, names, positions):
    return [(n, s.seg_t0 - run.start, s.t1 - run.start, i) for s, n, i in zip(stats, names, positions)]


def network(run: RunData, stats: list[SegmentStats], names: list[str], positions: list[int], out: Path,
            several: bool) -> Made | None:
    links = _links(run)
    if not links:
        return None
    fig, axes = plot.figure(3, 1, width=10.0, height=2.8, sharex=True)
    spans = _time_spans(run, stats, names, positions)
    most = max(s.nic().rx_bytes for samples in links.values() for s in samples)
    unit, scale = ("GB", 1e9) if most >= 1e9 else ("MB", 1e6)
    panels = (("received, MB/s", lambda n: n.rx_rate / 1e6), ("sent, MB/s", lambda n: n.tx_rate / 1e6),
              (f"received since the start, {unit}", lambda n: n.rx_bytes / scale))
    for ax, (label, value) in zip(axes, panels):
        for j, (name, samples) in enumerate(links.items()):
            ax.plot([s.t - run.start for s in samples], [value(s.nic()) for s in samples], color=plot.color(j),
                    linewidth=1.0, label=name)
        ax.set_ylabel(label)
        plot.shade(ax, spans, label_top=ax is axes[0])
        _paused(ax, run, ax is axes[0])
        plot.legend_outside(ax)
    axes[-1].set_xlabel("seconds since the recording started")
    name = f"network{_suffix(run, several)}"
    title = f"Network per node over time{f' ({run.name})' if several else ''}"
    data = plot.save(fig, out, name, title)
    return Made(name, title, data, _network_finding(run, links, stats, names))


def _network_finding(run: RunData, links: dict[str, list], stats, names) -> str:
    peaks = []
    for name, samples in links.items():
        top = max(samples, key=lambda s: s.nic().rx_rate)
        # a rate is over the 0.5 s before its sample: the segment holding that stretch's middle
        where = next((n for s, n in zip(stats, names) if s.seg_t0 <= top.t - 0.25 <= s.t1), "between segments")
        peaks.append((top.nic().rx_rate / 1e6, name, where, samples[-1].nic().rx_bytes / 1e6))
    rate, name, where, _ = max(peaks)
    totals = "; ".join(f"{n}: {mb:.4g} MB received in all" for _, n, _, mb in peaks[:4])
    shared = any(k.endswith("shared)") for k in links)
    text = f"The highest receive rate was {rate:.3g} MB/s on {name}, during {where}; {totals}"
    if shared:
        text += " (a loopback counts every local process's traffic: both ranks', the telemetry's, other jobs')"
    return text + "."


def _node_cpu_label(samples: list) -> str:
    """Lab nodes read their quota cgroup (issue 26: all hosts read the whole machine, the same line each)."""
    quotas = {s.node_cpu_quota for s in samples}
    if quotas == {None}:
        return "node CPU, % of all cores"
    return f"node CPU, % of its {next(iter(quotas)):.2g}-core quota" if len(quotas) == 1 else "node CPU, % of its quota"


# ProcessGroupGloo's default work threads, which run a DDP bucket's all-reduce beside torch's own threads
GLOO_THREADS = 2


def implausible(sample, threads: int | None) -> str:
    """Why a system sample's own numbers contradict each other or the process ('' where they do not): a rank's
    process above what its threads could run (torch's, gloo's work threads, one more for ddptop's own: issue 44's
    "1176% of a core" with one thread per rank, a CPU time counted over a sliver of an interval), or its node at 0%
    while that process used CPU (the node holds the process: a baseline read afresh, not an idle machine)."""
    if threads and sample.proc_cpu_percent > 100.0 * (threads + GLOO_THREADS + 1):
        return f"rank {sample.rank}'s process at {sample.proc_cpu_percent:.0f}% with {threads} torch thread" + (
            "s" if threads != 1 else "")
    if sample.node_cpu_percent <= 0.0 < sample.proc_cpu_percent:
        return f"rank {sample.rank}'s node at 0% while its process used {sample.proc_cpu_percent:.0f}%"
    return ""


def system(run: RunData, stats: list[SegmentStats], names: list[str], positions: list[int], out: Path,
           several: bool) -> Made | None:
    if not run.samples:
        return None
    odd = [(s, why) for s in run.samples for why in (implausible(s, run.threads.get(s.rank)),) if why]
    dropped = {id(s) for s, _ in odd}
    kept = [s for s in run.samples if id(s) not in dropped]  # neither drawn nor stated
    if not kept:
        return None
    by_rank: dict[int, list] = {}
    for s in kept:
        by_rank.setdefault(s.rank, []).append(s)
    hosts: dict[str, list] = {}
    for rank in sorted(by_rank):
        hosts.setdefault(by_rank[rank][0].host, by_rank[rank])
    gpu = any(s.gpus for s in kept)
    by_rank = dict(sorted(by_rank.items()))
    panels = [("process CPU, % of one core", by_rank, lambda s: [s.proc_cpu_percent], "rank {}"),
              (_node_cpu_label(kept), hosts, lambda s: [s.node_cpu_percent], "{}"),
              ("process resident memory, MB", by_rank, lambda s: [s.proc_rss_bytes / 1e6], "rank {}")]
    if gpu:
        panels.append(("GPU utilization, %", by_rank, lambda s: [g.util_percent for g in s.gpus], "rank {} GPU"))
    spans = _time_spans(run, stats, names, positions)
    # the first panel's legend also names the segments (8 in cs744-lab: 12 entries of ~0.2 in): its row grows
    # with them, so that legend ends above the next panel's (issue 26: node0 covered a segment's name)
    first = max(1.0, (len(by_rank) + len(spans) + 1) / 8)
    ratios = [first] + [1.0] * (len(panels) - 1)
    fig, axes = plot.figure(len(panels), 1, width=10.0, height=2.5 * sum(ratios) / len(panels), sharex=True,
                            gridspec_kw={"height_ratios": ratios})
    for ax, (label, groups, value, fmt) in zip(axes, panels):
        for j, (key, samples) in enumerate(groups.items()):
            ys = [(value(s) or [None])[0] for s in samples]
            keep = [(s.t - run.start, y) for s, y in zip(samples, ys) if y is not None]
            ax.plot([k[0] for k in keep], [k[1] for k in keep], color=plot.color(j), linewidth=1.0,
                    label=fmt.format(key))
        ax.set_ylabel(label)
        ax.set_ylim(bottom=0, top=105 if "all cores" in label or "GPU" in label else None)
        plot.shade(ax, spans, label_top=ax is axes[0])
        _paused(ax, run, ax is axes[0])
        plot.legend_outside(ax)
    axes[-1].set_xlabel("seconds since the recording started")
    if odd:
        plot.note(fig, f"{len(odd)} implausible sample{'s' if len(odd) != 1 else ''} left out (the first: "
                       f"{odd[0][1]}, {odd[0][0].t - run.start:.0f} s in).")
    name = f"system{_suffix(run, several)}"
    title = f"CPU and memory over time{f' ({run.name})' if several else ''}"
    data = plot.save(fig, out, name, title)
    cpu = max(kept, key=lambda s: s.proc_cpu_percent)
    finding = (f"The busiest rank process reached {cpu.proc_cpu_percent:.0f}% of a core (rank {cpu.rank}, "
               f"{cpu.t - run.start:.0f} s in); the most resident memory was "
               f"{max(s.proc_rss_bytes for s in kept) / 1e6:.0f} MB.")
    if odd:
        finding += (f" {len(odd)} sample{'s' if len(odd) != 1 else ''} whose numbers contradict the process or its "
                    f"node {'were' if len(odd) != 1 else 'was'} left out of the figure and these numbers: "
                    + "; ".join(f"{why} ({s.t - run.start:.0f} s in)" for s, why in odd[:3])
                    + ("; …" if len(odd) > 3 else "") + ".")
    return Made(name, title, data, finding)
