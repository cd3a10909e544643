"""PNG figures for a report (matplotlib, no display needed)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from ddptop.report.analysis import Scaling, SegmentStats  # noqa: E402


def _bars(ax, names: list[str], values: list[float], ylabel: str, title: str) -> None:
    ax.bar(range(len(values)), values, color="#4C72B0")
    ax.set_xticks(range(len(names)), names, rotation=20, ha="right", fontsize=8)
    ax.set_ylabel(ylabel)
    ax.set_title(title)


def _save(fig, out: Path, name: str) -> str:
    fig.tight_layout()
    fig.savefig(out / name, dpi=110)
    plt.close(fig)
    return name


def step_time(stats: list[SegmentStats], out: Path) -> str:
    fig, ax = plt.subplots(figsize=(7, 4))
    _bars(ax, [s.name for s in stats], [s.mean_step_s for s in stats], "seconds per step (mean)",
          "Step time per configuration")
    return _save(fig, out, "step_time.png")


def bytes_per_step(stats: list[SegmentStats], param_bytes: int, out: Path) -> str:
    """What the NIC counted next to what the ring/gather formulas say each rank sends."""
    fig, ax = plt.subplots(figsize=(7, 4))
    x = range(len(stats))
    ax.bar([i - 0.2 for i in x], [s.sent_mb_per_step for s in stats], 0.4, label="expected (formulas)")
    nic = [s.nic_sent_mb_per_step if s.nic_sent_mb_per_step is not None else 0.0 for s in stats]
    ax.bar([i + 0.2 for i in x], nic, 0.4, label="NIC counted (0: ranks on one machine share lo)")
    ax.set_xticks(list(x), [s.name for s in stats], rotation=20, ha="right", fontsize=8)
    ax.set_ylabel("MB sent per rank per step")
    ax.set_title(f"Bytes per step (gradients: {param_bytes / 1e6:.1f} MB)")
    ax.legend(fontsize=8)
    return _save(fig, out, "bytes_per_step.png")


def cpu_memory(stats: list[SegmentStats], out: Path) -> str:
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    _bars(a, [s.name for s in stats], [s.cpu_percent or 0.0 for s in stats], "% of one core (per rank)",
          "CPU per configuration")
    _bars(b, [s.name for s in stats], [s.rss_mb or 0.0 for s in stats], "MB resident (per rank)",
          "Memory per configuration")
    return _save(fig, out, "cpu_memory.png")


def loss(stats: list[SegmentStats], out: Path) -> str:
    fig, ax = plt.subplots(figsize=(8, 4))
    for s in stats:
        ax.plot([p[0] for p in s.losses], [p[1] for p in s.losses], label=s.name)
    ax.set_xlabel("step")
    ax.set_ylabel("training loss (mean over ranks)")
    ax.set_title("Loss per configuration")
    ax.legend(fontsize=7)
    return _save(fig, out, "loss.png")


def breakdown(stats: list[SegmentStats], out: Path) -> str:
    """Compute vs communication: hidden comm overlaps compute, exposed comm adds to the step."""
    fig, ax = plt.subplots(figsize=(7, 4))
    x = list(range(len(stats)))
    compute = [s.compute_s for s in stats]
    exposed = [s.exposed_comm_s for s in stats]
    hidden = [s.comm_s - s.exposed_comm_s for s in stats]
    other = [max(0.0, s.mean_step_s - c - e) for s, c, e in zip(stats, compute, exposed)]
    ax.bar(x, compute, label="compute")
    ax.bar(x, exposed, bottom=compute, label="exposed communication")
    ax.bar(x, other, bottom=[c + e for c, e in zip(compute, exposed)], label="other (data, waits)")
    ax.scatter(x, hidden, marker="_", s=400, color="black", label="communication hidden under compute")
    ax.set_xticks(x, [s.name for s in stats], rotation=20, ha="right", fontsize=8)
    ax.set_ylabel("seconds per step")
    ax.set_title("Compute vs communication")
    ax.legend(fontsize=7)
    return _save(fig, out, "breakdown.png")


def scaling_figure(rows: list[Scaling], out: Path) -> str:
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    for config in sorted({r.config for r in rows}):
        mine = [r for r in rows if r.config == config]
        a.plot([r.world_size for r in mine], [r.speedup for r in mine], marker="o", label=config)
        b.plot([r.world_size for r in mine], [r.efficiency for r in mine], marker="o", label=config)
    sizes = sorted({r.world_size for r in rows})
    a.plot(sizes, [n / sizes[0] for n in sizes], "k--", label="ideal")
    a.set_xlabel("ranks")
    a.set_ylabel("speedup (throughput)")
    b.set_xlabel("ranks")
    b.set_ylabel("scaling efficiency")
    a.legend(fontsize=7)
    return _save(fig, out, "scaling.png")

