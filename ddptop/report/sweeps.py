"""Figures for sweeps of one setting: DDP bucket size (CS744 figs 5-7), batch size (figs 9-10), sync vs async
(figs 15-16) and, across recordings, speedup and scaling efficiency (HPML Lab 4). Each is drawn only when the
segments shown vary that setting."""

from __future__ import annotations

from pathlib import Path

from ddptop.report import plot
from ddptop.report.analysis import Scaling, SegmentStats, pooled, rounds_spread
from ddptop.report.figures import Made, _offsets

NAN = float("nan")  # not measured: plot.bars writes n/a instead of a bar


def _grouped(ax, groups: list[str], series: list[tuple[str, list[float], list[float] | None, list[float] | None]],
             label: str) -> None:
    offsets, w = _offsets(len(series))
    values = []
    for j, (name, heights, lo, hi) in enumerate(series):
        plot.bars(ax, [i + offsets[j] for i in range(len(groups))], heights, width=w, label=name, color=plot.color(j),
                  lo=lo, hi=hi, whisker_legend=lo is not None)
        values += heights + (lo or []) + (hi or [])
    plot.categories(ax, groups)
    plot.value_axis(ax, values, label)
    plot.legend_outside(ax)


def _times(stats: list[SegmentStats]):
    return ("step (slowest rank)", [s.mean_step_s for s in stats], [s.step_p10 for s in stats],
            [s.step_p90 for s in stats])


def _sweep(stats: list[SegmentStats], vary: str, same) -> list[SegmentStats]:
    """The largest group of segments alike in `same(s)` that runs at least two values of `vary`."""
    groups: dict = {}
    for s in stats:
        groups.setdefault(same(s), []).append(s)
    swept = [g for g in groups.values() if len({getattr(s.config, vary) for s in g}) > 1]
    return sorted(max(swept, key=len), key=lambda s: (s.label, getattr(s.config, vary), s.index)) if swept else []


def _distinct(names: list[str], stats: list[SegmentStats]) -> list[str]:
    return [f"{n} (#{s.index})" if names.count(n) > 1 else n for n, s in zip(names, stats)]


def _alike(s: SegmentStats) -> tuple:
    """What two segments of a sweep must share for one setting's effect to be read off them: a step of 4
    accumulated micro-steps or a compressed gradient is another race (issue 44: an accum-4 fp16 segment pooled
    with a plain 0.05 MB one made "the backward pass took 0.059 s longer with the most overlap")."""
    return s.label, s.config.batch_size, s.config.lr, s.config.accum, s.config.compress


def _settings(s: SegmentStats) -> str:
    c = s.config
    return f"accum {c.accum}, " + ("no compression" if c.compress == "none" else f"{c.compress} compression")


def _left_out(kept: list[SegmentStats], others: list[SegmentStats]) -> str:
    """The segments of the same run left out of a sweep for another accumulation or compression, in words."""
    runs = {s.label for s in kept}
    left = [s for s in others if s not in kept and s.label in runs and (s.config.accum, s.config.compress) not in
            {(k.config.accum, k.config.compress) for k in kept}]
    if not left:
        return ""
    return " S" + "; ".join(f"segment {s.index} ({s.config.describe()})" for s in left)[1:] + \
        f" left out: {'it' if len(left) == 1 else 'each'} ran another accumulation or compression."


def bucket_size(stats: list[SegmentStats], out: Path) -> Made | None:
    ddp = _sweep([s for s in stats if s.config.strategy == "ddp"], "bucket_mb", _alike)
    if not ddp:
        return None
    several = len({s.label for s in ddp}) > 1
    groups = _distinct([(f"{s.label} " if several else "") + f"{s.config.bucket_mb:g} MB" for s in ddp], ddp)
    groups = [g + (f"\n{len(s.buckets_mb)} bucket{'s' if len(s.buckets_mb) > 1 else ''}" if s.buckets_mb else "")
              for g, s in zip(groups, ddp)]
    # 0.9 inch a group: two-line labels of 12 segments (two rounds of 6 sizes) overlapped at 9 inches
    fig, (a, b) = plot.figure(2, 1, width=max(9.0, 0.9 * len(groups)), height=3.4)
    _grouped(a, groups, [_times(ddp), ("compute", [s.compute_s for s in ddp], None, None),
                         ("exposed communication", [s.exposed_comm_s for s in ddp], None, None)], "seconds per step")
    a.set_title("iteration time, the compute, and the communication left exposed", fontsize=9)
    links = sorted({l.name for s in ddp for l in s.links})
    shared = sorted({l.name for s in ddp for l in s.links if len(l.ranks) > 1})
    # a loopback shared by several ranks counts all of them: beside it goes its own formula (their sum), never one
    # rank's (issue 26: 0.084 MB per rank beside lo's 0.176 MB read as a 2x discrepancy)
    series = [] if shared else [("formula, per rank", [s.sent_mb_per_step for s in ddp], None, None)]
    for link in links:
        if link in shared:
            series.append((f"{link}: formula (its ranks together)",
                           [next((l.formula_sent_mb for l in s.links if l.name == link), NAN) for s in ddp], None, None))
        series.append((f"{link}: counted", [next((l.sent_mb for l in s.links if l.name == link), NAN) for s in ddp],
                       None, None))
    _grouped(b, groups, series, "MB sent per step")
    b.set_title("bytes per step", fontsize=9)
    run = f"{ddp[0].label}: " if not several and len({s.label for s in stats}) > 1 else ""  # which run's sweep
    data = plot.save(fig, out, "bucket_size", f"{run}DDP bucket size: iteration time and bytes (batch "
                                              f"{ddp[0].config.batch_size}/rank, lr {ddp[0].config.lr:g}, "
                                              f"{_settings(ddp[0])})")
    return Made("bucket_size", "DDP bucket size", data,
                _bucket_finding(ddp) + _left_out(ddp, [s for s in stats if s.config.strategy == "ddp"]))


def _bucket_finding(ddp: list[SegmentStats]) -> str:
    """Per bucket size (a size run in several segments, i.e. rounds, pooled by measured steps): step, overlap,
    exposed communication and compute, and what they say about each other."""
    sizes = sorted({s.config.bucket_mb for s in ddp})

    def per_size(name: str) -> list[float]:
        return [pooled([s for s in ddp if s.config.bucket_mb == size], name) for size in sizes]

    step, overlap, exposed, compute = (per_size(n) for n in ("mean_step_s", "overlap", "exposed_comm_s", "compute_s"))
    joined = lambda values, fmt: " / ".join(format(v, fmt) for v in values)  # noqa: E731
    layouts = {s.buckets_mb for s in ddp}
    if len(sizes) > 1 and len(layouts) == 1 and all(layouts):
        (layout,) = layouts
        return (f"The sweep changed nothing: at every size ({joined(sizes, 'g')} MB) DDP made the same "
                f"{len(layout)} bucket{'s' if len(layout) > 1 else ''} ({' + '.join(f'{b:.3g}' for b in layout)} MB "
                f"of gradients), so step {joined(step, '.3g')} s is one setting measured {len(ddp)} times; its "
                "differences are noise.")
    noise = noise_share(ddp)
    spread = (max(step) - min(step)) / min(step) if min(step) > 0 else 0.0
    fastest = (f"fastest at {sizes[step.index(min(step))]:g} MB" if spread > noise else
               f"no size faster than the noise ({100 * spread:.0f}% apart, within {100 * noise:.0f}%)")
    text = (f"At {joined(sizes, 'g')} MB" + (" (each size's segments pooled)" if len(sizes) < len(ddp) else "")
            + f": step {joined(step, '.3g')} s, {fastest}; overlap "
            + " / ".join(f"{100 * v:.0f}%" for v in overlap) + f"; exposed communication {joined(exposed, '.3g')} s; "
            f"compute {joined(compute, '.3g')} s")
    if compute[0] > 1.1 * compute[-1]:
        text += (f" — the backward pass took {compute[0] - compute[-1]:.2g} s longer with the most overlap: the "
                 "overlapped communication shares its CPU")
    elif len(sizes) > 1:
        text += " — overlap cost the backward pass under 10% of its time"
    one = [s for s in ddp if len(s.buckets_mb) == 1]
    if one:
        text += f" (at {one[0].config.bucket_mb:g} MB all {one[0].buckets_mb[0]:.3g} MB of gradients are one bucket)"
    return text + "."




def noise_share(stats: list[SegmentStats]) -> float:
    """How far apart one configuration's mean step time lands when measured twice, as a share of it: the rounds'
    spread (a sweep repeated in rounds), else the widest p10–p90 of a segment's steps over its mean (no rounds: the
    steps' own scatter). A difference between configurations is stated only beyond it (issue 26)."""
    rounds = rounds_spread(stats)
    if rounds is not None:
        return rounds[0]
    return max(((s.step_p90 - s.step_p10) / s.mean_step_s for s in stats
                if s.mean_step_s > 0 and s.step_p90 == s.step_p90), default=0.0)


def batch_size(stats: list[SegmentStats], out: Path) -> Made | None:
    ordered = _sweep(stats, "batch_size", lambda s: (s.label, s.config.strategy, s.config.bucket_mb, s.config.async_op,
                                                     s.config.accum, s.config.compress))
    if not ordered:
        return None
    groups = _distinct([f"{s.label} batch {s.config.batch_size}".strip() for s in ordered], ordered)
    fig, (a, b) = plot.figure(2, 1, width=9.0, height=3.4)
    _grouped(a, groups, [_times(ordered)], "seconds per step")
    a.set_title("iteration time", fontsize=9)
    _grouped(b, groups, [("job", [s.images_per_s for s in ordered], None, None)], "images per second")
    b.set_title("throughput: every rank's images / the slowest rank's time", fontsize=9)
    c = ordered[0].config
    what = c.strategy + (f" {c.bucket_mb:g} MB buckets" if c.strategy == "ddp" else "")
    what += " async" if c.async_op else ""
    data = plot.save(fig, out, "batch_size", f"Batch size: iteration time and throughput ({what})")
    best = max(ordered, key=lambda s: s.images_per_s)
    small = min(ordered, key=lambda s: s.config.batch_size)
    text = (f"Throughput was highest at batch {best.config.batch_size} ({best.images_per_s:.0f} img/s, "
            f"{best.images_per_s / small.images_per_s:.2f}× batch {small.config.batch_size}'s); loss and accuracy "
            "per batch size are on the loss figure, one segment after another.")
    return Made("batch_size", "Batch size", data, text)


def sync_async(stats: list[SegmentStats], out: Path) -> Made | None:
    pairs = [s for s in stats if s.config.strategy == "allreduce"]
    if {s.config.async_op for s in pairs} != {False, True}:
        return None
    pairs.sort(key=lambda s: (s.label, s.config.async_op, s.index))
    groups = _distinct([f"{s.label} {'async' if s.config.async_op else 'sync'}".strip() for s in pairs], pairs)
    links = sorted({l.name for s in pairs for l in s.links})
    fig, axes = plot.figure(3 if links else 2, 1, width=8.0, height=3.0)
    _grouped(axes[0], groups, [_times(pairs)], "seconds per step")
    axes[0].set_title("iteration time", fontsize=9)
    _grouped(axes[1], groups, [("communication", [s.comm_s for s in pairs], None, None),
                               ("exposed", [s.exposed_comm_s for s in pairs], None, None)], "seconds per step")
    axes[1].set_title("communication (mean over ranks)", fontsize=9)
    if links:
        _grouped(axes[2], groups, [(f"{link}", [next((l.recv_mb for l in s.links if l.name == link), NAN)
                                               for s in pairs], None, None) for link in links],
                 "MB received per step (NIC)")
        axes[2].set_title("bytes received (CS744 fig 16)", fontsize=9)
    data = plot.save(fig, out, "sync_async", "Synchronous vs asynchronous all_reduce")
    sync, asyn = ([s for s in pairs if s.config.async_op == on] for on in (False, True))
    step = [pooled(side, "mean_step_s") for side in (sync, asyn)]
    comm = [pooled(side, "comm_s") for side in (sync, asyn)]
    change = (step[1] - step[0]) / step[0]
    text = (f"async_op=on {'cut' if change < 0 else 'raised'} the step time from {step[0]:.3g} to {step[1]:.3g} s "
            f"({change:+.0%}) and the communication from {comm[0] * 1e3:.0f} to {comm[1] * 1e3:.0f} ms per step"
            + (" (each side's segments pooled)" if len(pairs) > 2 else "")
            + "; the loss figure has their losses on one axis.")
    return Made("sync_async", "Synchronous vs asynchronous", data, text[0].upper() + text[1:])


def scaling_figure(rows: list[Scaling], out: Path) -> Made:
    fig, (a, b) = plot.figure(2, 1, width=9.0, height=3.4)
    for j, config in enumerate(sorted({r.config for r in rows})):
        mine = [r for r in rows if r.config == config]
        a.plot([r.world_size for r in mine], [r.speedup for r in mine], marker="o", color=plot.color(j), label=config)
        b.plot([r.world_size for r in mine], [100 * r.efficiency for r in mine], marker="o", color=plot.color(j),
               label=config)
    sizes = sorted({r.world_size for r in rows})
    a.plot(sizes, [n / sizes[0] for n in sizes], "k--", linewidth=1, label="ideal (weak scaling)")
    b.axhline(100, color="black", linestyle="--", linewidth=1, label="ideal")
    for ax, label in ((a, "speedup in throughput, ×"), (b, "scaling efficiency, %")):
        ax.set_xlabel("ranks")
        ax.set_xticks(sizes)
        ax.set_ylabel(label)
        plot.legend_outside(ax)
    b.set_ylim(0, max(110.0, 10 + max(100 * r.efficiency for r in rows)))
    data = plot.save(fig, out, "scaling", "Speedup and scaling efficiency")
    top = max(rows, key=lambda r: (r.world_size, r.speedup))
    text = (f"At {top.world_size} ranks {top.config} ran {top.speedup:.2f}× the throughput of "
            f"{sizes[0]} rank{'s' if sizes[0] > 1 else ''} ({100 * top.efficiency:.0f}% efficiency).")
    return Made("scaling", "Speedup and scaling efficiency", data, text)
