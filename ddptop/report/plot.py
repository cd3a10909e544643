"""Matplotlib plumbing for report figures: one style, PNG/SVG/PDF output, and the plotted values read back.

`save` writes every figure as PNG, SVG and PDF (or PNG only, `formats`) and returns what the figure holds (bar heights, whisker ends, line points,
shaded segments) read back from matplotlib's own artists, so `figures.json` and the tests see what was drawn,
not a second computation of it.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from pathlib import Path
from typing import Any, Sequence

import matplotlib

matplotlib.use("Agg")
# no mathtext: text from a recording (host names, interfaces) is drawn as written, `$` included, never parsed
matplotlib.rcParams["text.parse_math"] = False
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.container import BarContainer, ErrorbarContainer  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.ticker import FuncFormatter  # noqa: E402

from ddptop.safe import replacing  # noqa: E402

DPI = 160  # PNG resolution: the issue asks for ≥ 150
FORMATS = ("png", "svg", "pdf")
# the formats `save` writes (`report --formats`): PNG always (report.html embeds it); SVG and PDF draw each figure
# again, about half of a report's CPU time, so a report only read on screen can leave them out
_FORMATS: contextvars.ContextVar[tuple[str, ...]] = contextvars.ContextVar("formats", default=FORMATS)
LOG_SPAN = 10.0  # a value axis goes logarithmic when its positive values span more than 10×
PALETTE = ("#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3", "#937860", "#DA8BC3", "#8C8C8C", "#CCB974",
           "#64B5CD")
STYLE = {"font.size": 10, "axes.titlesize": 11, "axes.labelsize": 10, "legend.fontsize": 9, "xtick.labelsize": 9,
         "ytick.labelsize": 9, "axes.spines.top": False, "axes.spines.right": False, "svg.fonttype": "none",
         "axes.grid": True, "grid.alpha": 0.3, "axes.axisbelow": True, "figure.dpi": 100,
         "svg.hashsalt": "ddptop"}  # the same recording gives the same SVG bytes


def color(i: int) -> str:
    return PALETTE[i % len(PALETTE)]


def figure(rows: int = 1, cols: int = 1, width: float = 9.0, height: float = 4.2, **kw):
    with plt.rc_context(STYLE):
        fig, axes = plt.subplots(rows, cols, figsize=(width, height * rows), squeeze=False, **kw)
    return fig, [ax for row in axes for ax in row]


def needs_log(values: Sequence[float]) -> bool:
    """True when the positive values span more than LOG_SPAN× (one outlier would flatten the rest)."""
    positive = [v for v in values if v is not None and math.isfinite(v) and v > 0]
    return len(positive) >= 2 and max(positive) / min(positive) > LOG_SPAN


def value_axis(ax, values: Sequence[float], label: str, axis: str = "y") -> None:
    """Label a value axis with its unit; logarithmic (and said so) when the values span more than 10×."""
    log = needs_log(values)
    set_scale, set_label = (ax.set_yscale, ax.set_ylabel) if axis == "y" else (ax.set_xscale, ax.set_xlabel)
    if log:
        set_scale("log")
        which = ax.yaxis if axis == "y" else ax.xaxis
        plain = FuncFormatter(lambda v, _: f"{v:g}")  # 20, not 2×10¹
        which.set_major_formatter(plain)
        get = ax.get_ylim if axis == "y" else ax.get_xlim

        def minor(v, _):  # 2 and 5 between the decades, while the axis spans at most two of them
            lo, hi = get()
            few = lo > 0 and hi / lo <= 100
            return f"{v:g}" if few and v > 0 and f"{v:.0e}"[0] in "25" else ""

        which.set_minor_formatter(FuncFormatter(minor))
    set_label(f"{label} (log scale)" if log else label)


def bars(ax, positions, heights, *, width=0.8, label=None, bottoms=None, lo=None, hi=None, whisker_legend=True,
         **kw):
    """Bars with optional whiskers from lo to hi (p10-p90); the whiskers are read back under the bars' label."""
    ax.bar(positions, heights, width, bottom=bottoms, label=label, **kw)
    for x, h in zip(positions, heights):
        if not math.isfinite(h):  # not measured: said so where the bar would be, never drawn as a zero
            ax.annotate("n/a", (x, 0), textcoords="offset points", xytext=(0, 3), ha="center", va="bottom",
                        fontsize=8, color="#777777", xycoords=("data", "axes fraction"))
    if lo is not None and hi is not None:
        below = [max(0.0, h - a) if math.isfinite(h - a) else 0.0 for h, a in zip(heights, lo)]
        above = [max(0.0, b - h) if math.isfinite(b - h) else 0.0 for h, b in zip(heights, hi)]
        c = ax.errorbar(positions, heights, yerr=[below, above], fmt="none", ecolor="#222222", elinewidth=1.0,
                        capsize=3, label="p10–p90" if whisker_legend else "_p10–p90")
        c.lines[2][0].set_gid(label or "")


def categories(ax, names: Sequence[str], rotate: bool | None = None) -> None:
    rotate = rotate if rotate is not None else (max((len(n) for n in names), default=0) * len(names) > 70)
    ax.set_xticks(range(len(names)), names, rotation=25 if rotate else 0, ha="right" if rotate else "center")
    ax.grid(axis="x", visible=False)
    ax.set_xlim(-0.6, len(names) - 0.4)  # missing (nan) bars at either end must not shrink the axis


def legend_outside(ax, reverse: bool = False, **kw) -> None:
    """The legend right of the axes, never over the data (reversed: in the order a stacked bar shows them)."""
    handles, labels = ax.get_legend_handles_labels()
    if reverse:
        handles, labels = handles[::-1], labels[::-1]
    if handles:
        ax.legend(handles, labels, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0, frameon=False,
                  **kw)


def shade(ax, spans: Sequence[tuple[str, float, float, int]], label_top: bool = True) -> None:
    """Shade each segment's stretch of the x axis in its colour; readback keeps (name, x0, x1).

    Names go above the axes where each fits its stretch, else into the legend (label_top: this axes names them)."""
    if not spans:
        return
    lo = min(ax.get_xlim()[0], min(s[1] for s in spans))
    hi = max(ax.get_xlim()[1], max(s[2] for s in spans))
    width_pt = ax.get_position().width * ax.figure.get_figwidth() * 72
    fits = all((x1 - x0) / (hi - lo) * width_pt > 5.2 * len(name) + 6 for name, x0, x1, _ in spans)
    for name, x0, x1, index in spans:
        patch = ax.axvspan(x0, x1, color=color(index), alpha=0.12, linewidth=0,
                           label=f"segment: {name}" if label_top and not fits else None)
        patch.set_gid(f"segment:{name}")
        if label_top and fits:
            ax.text((x0 + x1) / 2, 1.0, name, transform=ax.get_xaxis_transform(), ha="center", va="bottom",
                    fontsize=8, color=color(index), clip_on=False)
    ax.set_xlim(lo, hi)


def note(fig, text: str) -> None:
    """A line under the axes (what is missing and why), kept out of the data area."""
    fig.text(0.01, 0.005, text, fontsize=8, color="#555555", ha="left", va="bottom")


@contextlib.contextmanager
def formats(chosen: Sequence[str]):
    """Within the block, `save` writes only these formats (PNG among them), in FORMATS' order."""
    token = _FORMATS.set(tuple(f for f in FORMATS if f in chosen))
    try:
        yield
    finally:
        _FORMATS.reset(token)


def save(fig, out: Path, name: str, title: str) -> dict[str, Any]:
    """Write NAME.png (DPI), and .svg and .pdf unless `formats` says otherwise; return the figure's plotted data,
    read back from its artists."""
    fig.suptitle(title, fontsize=12, fontweight="bold")
    with plt.rc_context(STYLE):
        fig.tight_layout(rect=(0, 0.03, 1, 1))
        # the tight box once (legends outside included), not once per format: drawing is most of a report's time
        box = fig.get_tightbbox(fig.canvas.get_renderer()).padded(0.1)
        data = readback(fig)  # after the tight box: it places the axis labels where the layout left the axes
        for fmt in _FORMATS.get():
            with replacing(out / f"{name}.{fmt}", "wb") as f:  # through no link planted at the name (safe.py)
                fig.savefig(f, format=fmt, dpi=DPI, bbox_inches=box, metadata=_metadata(fmt))
    plt.close(fig)
    return {"title": title, "files": [f"{name}.{fmt}" for fmt in _FORMATS.get()], "axes": data, "notes": notes(fig)}


def _metadata(fmt: str) -> dict:
    # no creation dates: regenerating a report from the same recording gives the same SVG and PDF bytes
    return {"svg": {"Date": None}, "pdf": {"CreationDate": None}}.get(fmt, {})


def readback(fig) -> list[dict[str, Any]]:
    """What each axes shows: labels, scale, tick names, bars, whiskers, lines and shaded segments."""
    out = []
    for ax in fig.axes:
        if not ax.get_visible() or ax.get_label() == "<colorbar>":
            continue
        out.append({"title": ax.get_title(), "xlabel": ax.get_xlabel(), "ylabel": ax.get_ylabel(),
                    "xscale": ax.get_xscale(), "yscale": ax.get_yscale(),
                    "xticklabels": [t.get_text() for t in ax.get_xticklabels()],
                    "bars": _bars(ax), "whiskers": _whiskers(ax), "lines": _lines(ax), "segments": _spans(ax),
                    "legend": [t.get_text() for t in ax.get_legend().get_texts()] if ax.get_legend() else [],
                    "legend_box": _box(ax.get_legend()) if ax.get_legend() else None,
                    "ylabel_box": _box(ax.yaxis.label) if ax.get_ylabel() else None,
                    "xticklabels_box": _union([_box(t) for t in ax.get_xticklabels() if t.get_text()])})
    return out


def notes(fig) -> list[str]:
    """The figure's own texts (the footnotes under it)."""
    return [t.get_text() for t in fig.texts]


def _union(boxes: list[list[float]]) -> list[float] | None:
    if not boxes:
        return None
    return [min(b[0] for b in boxes), min(b[1] for b in boxes), max(b[2] for b in boxes), max(b[3] for b in boxes)]


def _box(artist) -> list[float]:
    """Where an artist was drawn, in figure pixels (x0, y0, x1, y1): legends that must not cover each other."""
    return [round(v, 1) for v in artist.get_window_extent().extents]


def _bars(ax) -> list[dict[str, Any]]:
    return [{"label": c.get_label(), "x": [float(p.get_x() + p.get_width() / 2) for p in c.patches],
             "height": [float(p.get_height()) for p in c.patches], "bottom": [float(p.get_y()) for p in c.patches]}
            for c in ax.containers if isinstance(c, BarContainer)]


def _whiskers(ax) -> list[dict[str, Any]]:
    out = []
    for c in ax.containers:
        if isinstance(c, ErrorbarContainer) and c.lines[2]:
            segments = [seg for seg in c.lines[2][0].get_segments() if len(seg) == 2]  # nan whiskers: none drawn
            out.append({"series": c.lines[2][0].get_gid() or "", "x": [float(s[0][0]) for s in segments],
                        "lo": [float(min(s[0][1], s[1][1])) for s in segments],
                        "hi": [float(max(s[0][1], s[1][1])) for s in segments]})
    return out


def _lines(ax) -> list[dict[str, Any]]:
    return [{"label": line.get_label(), "x": [float(v) for v in line.get_xdata()],
             "y": [float(v) for v in line.get_ydata()]}
            for line in ax.get_lines() if isinstance(line, Line2D) and not line.get_label().startswith("_")]


def _spans(ax) -> list[dict[str, Any]]:
    out = []
    for patch in ax.patches:
        gid = patch.get_gid() or ""
        if gid.startswith("segment:"):
            x0 = patch.get_x()
            out.append({"name": gid[len("segment:"):], "x0": float(x0), "x1": float(x0 + patch.get_width())})
    return out
