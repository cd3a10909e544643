"""Provides the predicted-vs-measured figure: each segment's predicted step time (the what-if model fitted on the
segment `ddptop advise` picks) against its measured one, the y = x line and a ±10% band. Its points are the
report's "Predicted vs measured" table (ddptop.record.whatif.versus, RunData.versus), drawn."""

from __future__ import annotations

from pathlib import Path
from textwrap import fill

from ddptop.metrics.whatif.rows import name
from ddptop.report import plot
from ddptop.report.figures import Made
from ddptop.report.runs import RunData

BAND = 0.10  # the band drawn around y = x: the model's stated median error (README "What-if / advise")


def figure(runs: list[RunData], out: Path) -> Made | None:
    """None when no run has a segment to check a prediction against."""
    found = [(run, run.versus) for run in runs if run.versus is not None]
    if not found:
        return None
    fig, (ax,) = plot.figure(width=7.0, height=6.0)
    values = [v for _, (_, rows, _, _) in found for r in rows for v in (r["measured_step_s"], r["step_s"])]
    lo, hi = min(values) * 0.85, max(values) * 1.12
    ax.plot([lo, hi], [lo, hi], color="#333333", linewidth=1, label="y = x (predicted = measured)")
    ax.fill_between([lo, hi], [lo * (1 - BAND), hi * (1 - BAND)], [lo * (1 + BAND), hi * (1 + BAND)],
                    color="#999999", alpha=0.2, linewidth=0, label=f"±{BAND:.0%}")
    for i, (run, (fitted, rows, median, worst)) in enumerate(found):
        label = f"{run.name}: fitted on segment {fitted}" if len(found) > 1 else f"fitted on segment {fitted}"
        x, y = [r["measured_step_s"] for r in rows], [r["step_s"] for r in rows]
        ax.errorbar(x, y, xerr=[r["measured_step_se_s"] for r in rows], yerr=[r["step_se_s"] for r in rows],
                    fmt="none", capsize=2, elinewidth=0.8, color=plot.color(i))  # ±1 standard error of each mean
        ax.plot(x, y, linestyle="none", marker="o", color=plot.color(i),
                label=f"{label} (median |error| {median:.1%}, max {worst:.1%})")
        for j, r in enumerate(sorted(rows, key=lambda r: r["measured_step_s"])):  # numbers: close points stay legible
            ax.annotate(str(r["segment"]), (r["measured_step_s"], r["step_s"]), textcoords="offset points",
                        xytext=(6, -10 if j % 2 else 3), fontsize=8, color=plot.color(i))
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_aspect("equal")
    ax.set_xlabel("measured s/step (slowest rank's mean)")
    ax.set_ylabel("predicted s/step")
    ax.set_title("each segment's configuration predicted from one segment, against its measurement\n(bars: ±1 "
                 "standard error of each mean from its steps' spread)", fontsize=9)
    ax.legend(loc="best", frameon=False, fontsize=8)  # inside: outside, it took half the width from a square plot
    segments = "; ".join(f"{run.name + ' ' if len(found) > 1 else ''}{r['segment']}: {name(r)}"
                         for run, (_, rows, _, _) in found for r in rows)
    plot.note(fig, fill(f"segments: {segments}", 100))
    data = plot.save(fig, out, "predicted", "Predicted vs measured step time")
    return Made("predicted", "Predicted vs measured step time", data, _finding(found))


def _finding(found: list) -> str:
    parts = []
    for run, (fitted, rows, median, worst) in found:
        far = max(rows, key=lambda r: abs(r["error"]))
        inside = sum(1 for r in rows if abs(r["error"]) <= BAND)
        noise = sum(1 for r in rows if abs(r["error"]) <= 2 * r["error_se"])
        parts.append(f"{run.name}: {inside} of {len(rows)} segments within ±{BAND:.0%} of the prediction from "
                     f"segment {fitted} (median |error| {median:.1%}), {noise} within twice the noise of their two "
                     f"segments; the farthest, segment {far['segment']} ({name(far)}), measured "
                     f"{far['measured_step_s']:.3g} s against {far['step_s']:.3g} s predicted ({far['error']:+.1%}, "
                     f"noise ±{far['error_se']:.1%})")
    return "; ".join(parts) + "."
