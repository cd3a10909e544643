"""The report page as blocks (headings, paragraphs, tables, figures), and those blocks as markdown."""

from __future__ import annotations

import re

from ddptop.report.analysis import SegmentStats
from ddptop.safe import clean

MARKDOWN_SPECIALS = "\\`*_[]<>|#"


def untrusted(text, limit: int | None = 500) -> str:
    """A string from a recording (host, command, GPU name…) as plain text: no markup, no HTML, one line."""
    out = clean(text, limit)
    for ch in MARKDOWN_SPECIALS:
        out = out.replace(ch, "\\" + ch)
    return out


def code(text) -> str:
    """A string from a recording inside `backticks` (a code span shows everything but a backtick literally)."""
    return "`" + clean(text, 1000).replace("`", "'") + "`"


COLUMNS = ("segment", "config", "ranks", "steps", "mean s/step (slowest rank)", "median s/step (slowest rank)",
           "p10–p90 s/step (slowest rank)", "mean s/step (mean over ranks)", "img/s", "compute s",
           "K−1 micro-steps s", "comm s", "exposed comm s", "overlap %", "ddptop ms/step",
           "ddptop threads CPU ms/step", "ddptop front CPU ms/step", "other s",
           "MB sent/step (formula)", "MB recv/step (formula)", "MB sent/step (NIC)", "MB recv/step (NIC)", "CPU %",
           "RSS MB", "all-reduce bus Gbit/s", "final loss")
# report.md shows these (24 columns are unreadable, issue 26); segments.csv beside it has every column above
ESSENTIAL = ("segment", "config", "ranks", "steps", "mean s/step (slowest rank)", "p10–p90 s/step (slowest rank)",
             "img/s", "compute s", "comm s", "exposed comm s", "overlap %", "MB sent/step (formula)",
             "MB sent/step (NIC)", "all-reduce bus Gbit/s", "final loss")

# A block is a tuple: ("h1"|"h2"|"h3"|"p"|"warn", text), ("list", [text]), ("code", text),
# ("table", header, rows), ("figure", Made). Text may hold **bold**, `code` and [links](url).


def _opt(value: float | None, fmt: str) -> str:
    return "–" if value is None else format(value, fmt)


def segment_name(s: SegmentStats) -> str:
    return f"{s.label}:{s.index}" if s.label else str(s.index)


def row(s: SegmentStats) -> list[str]:
    return [segment_name(s), s.config.describe(), str(s.world_size), str(s.measured_steps),
            f"{s.mean_step_s:.4f}", f"{s.median_step_s:.4f}", f"{s.step_p10:.4f}–{s.step_p90:.4f}",
            f"{s.mean_rank_step_s:.4f}", f"{s.images_per_s:.1f}", f"{s.compute_s:.4f}", f"{s.micro_s:.4f}",
            f"{s.comm_s:.4f}",
            f"{s.exposed_comm_s:.4f}", f"{100 * s.overlap:.1f}", f"{s.own_s * 1e3:.2f}" if s.own_recorded else "–",
            f"{s.threads_s * 1e3:.2f}" if s.threads_s > 0 else "–",
            f"{s.front_s * 1e3:.2f}" if s.front_s > 0 else "–",
            f"{s.other_s:.4f}",
            f"{s.sent_mb_per_step:.2f}", f"{s.recv_mb_per_step:.2f}", _opt(s.nic_sent_mb_per_step, ".2f"),
            _opt(s.nic_recv_mb_per_step, ".2f"), _opt(s.cpu_percent, ".0f"), _opt(s.rss_mb, ".0f"),
            _opt(s.bus_gbit_s, ".3f"), f"{s.final_loss:.4f}"]


def segment_table(stats: list[SegmentStats], unit: str = "img/s") -> tuple:
    """The page's table: the ESSENTIAL columns (all of them: `segment_csv`); `unit` names the images/s column
    (metrics.rate_unit of the runs' data sets)."""
    keep = [COLUMNS.index(c) for c in ESSENTIAL]
    header, rows = [unit if c == "img/s" else c for c in ESSENTIAL], [[r[i] for i in keep] for r in (row(s) for s in stats)]
    if any(s.tokens_per_s > 0 for s in stats):  # beside the rate, where some segment's batches said their tokens
        at = ESSENTIAL.index("img/s") + 1
        header.insert(at, "tokens/s")
        for cells, s in zip(rows, stats):
            cells.insert(at, f"{s.tokens_per_s:.0f}" if s.tokens_per_s > 0 else "–")
    return ("table", header, rows)


def segment_csv(stats: list[SegmentStats]) -> str:
    """Every column of the per-segment table as CSV (segments.csv), the same cells as the page's."""
    import csv
    import io

    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(COLUMNS)
    writer.writerows([c.replace("\\", "") for c in row(s)] for s in stats)  # untrusted()'s escapes are markdown's
    return out.getvalue()


def gpu_table(stats: list[SegmentStats]) -> tuple | None:
    """Seed 004's table per configuration: GPU memory-usage (the most used / total) and volatile GPU-util."""
    rows = []
    for s in stats:
        for g in s.gpus:
            used = "–" if g.mem_used_mib is None else f"{g.mem_used_mib:.0f} MiB"
            total = "" if g.mem_total_mib is None else f" / {g.mem_total_mib:.0f} MiB"
            util = "–" if g.util is None else f"{g.util.mean:.0f}% (p10–p90 {g.util.p10:.0f}–{g.util.p90:.0f}%)"
            rows.append([segment_name(s), s.config.describe(), f"{g.rank} ({untrusted(g.host)})",
                         f"{g.index}: {untrusted(g.name)}",
                         used + total, util])
    if not rows:
        return None
    return ("table", ["segment", "config", "rank (host)", "GPU", "GPU memory-usage (most used)",
                      "volatile GPU-util (mean)"], rows)


def render(blocks: list[tuple]) -> str:
    out = []
    for block in blocks:
        kind = block[0]
        if kind in ("h1", "h2", "h3"):
            out += ["#" * int(kind[1]) + " " + block[1], ""]
        elif kind == "p":
            out += [block[1], ""]
        elif kind == "warn":
            out += [f"> ⚠ {block[1]}", ""]
        elif kind == "list":
            out += [f"- {item}" for item in block[1]] + [""]
        elif kind == "code":
            out += ["```", block[1], "```", ""]
        elif kind == "table":
            out += _table(block[1], block[2]) + [""]
        elif kind == "figure":
            made = block[1]
            png, *others = made.data["files"]
            links = " · ".join(f"[{f.rsplit('.', 1)[1].upper()}]({f})" for f in others)
            out += [f"![{made.title}]({png})", "",
                    f"*What this shows:* {untrusted(made.finding, None)}" + (f" ({links})" if links else ""), ""]
    return "\n".join(out)


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    cell = lambda text: re.sub(r"(?<!\\)\|", r"\\|", str(text))  # a pipe not escaped already  # noqa: E731
    return (["| " + " | ".join(cell(h) for h in header) + " |", "|" + "---|" * len(header)]
            + ["| " + " | ".join(cell(c) for c in r) + " |" for r in rows])
