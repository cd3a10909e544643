"""Provides the What-if panel's drawing: the table the model predicts from the segment in force, its best
configuration, and every switch's prediction beside its measurement with the running error (the snapshot's
`whatif`, ddptop.state.advising: nothing is computed here but layout)."""

from __future__ import annotations

from rich.console import Group
from rich.table import Table
from rich.text import Text

from ddptop.metrics.whatif.rows import recommended
from ddptop.state.advising import STATED_ERROR, WhatIf, describe
from ddptop.state.session import Snapshot
from ddptop.tui.render import palette
from ddptop.tui.render.palette import GREEN, VERMILLION
from ddptop.tui.render.units import fmt_s

WIDE = 100  # from this width on, the table shows each row's measured segment too


def whatif(snap: Snapshot, width: int) -> Group:
    w = snap.whatif
    if w.seg is None:
        return Group(Text(f"what-if: no prediction yet: {w.why}", style="dim"),
                     Text("(the model fits once the segment in force has measured and sampled steps)", style="dim"))
    return Group(_head(w, width), Text(""), _table(w, width), Text(""), *_checks(w, width))


def _head(w: WhatIf, width: int) -> Text:
    seg = w.seg
    out = Text("fitted from segment ", style="bold")
    out.append(f"{seg.segment} ({_config(seg.config)}, {seg.world_size} ranks): measured {fmt_s(seg.step_s)}/step")
    if seg.step_se_s > 0:
        out.append(f" ±{fmt_s(seg.step_se_s)}", style="dim")  # its noise, which every prediction below carries
    out.append(f"\nstated error: {STATED_ERROR}", style="dim")
    if w.best is not None:
        out.append("\nbest: ", style="bold")
        out.append(describe(w.best), style=f"bold {GREEN}" if recommended(w.best) else "")
    out.append("\n")
    out.append_text(_running(w))
    return out


def _running(w: WhatIf) -> Text:
    """The running error over every switch checked so far, on one line (at the top: 80×24 shows it unscrolled)."""
    out = Text("running error ", style="bold")
    if w.running is None:
        out.append("none yet: it needs a switch and the new segment's measured steps", style="dim")
        return out
    median, most = w.running
    n = len(w.errors)
    out.append(f"median {median:.1%}, max {most:.1%} over {n} switch{'es' if n != 1 else ''} (listed below)",
               style=VERMILLION if most > 0.20 else "")
    return out


def _config(cfg) -> str:
    from ddptop.metrics.whatif.rows import config_name

    return config_name(dict(cfg))


def _table(w: WhatIf, width: int) -> Table:
    from ddptop.metrics.whatif.rows import ranked_s

    table = Table(box=None, padding=(0, 1), header_style="bold reverse", pad_edge=False,
                  caption="acc/cmp: gradient accumulation / compression. gain vs now: measured where a segment ran "
                  "it, else predicted; within ±1 standard error it is no better", caption_justify="left",
                  caption_style="dim")
    wide = width >= WIDE
    for name in ("strategy", "bucket", "async", "acc/cmp", "step", "exposed", "overlap", "gain vs now", *(
            ("MB/rank", "measured") if wide else ())):
        table.add_column(name, justify="left" if name in ("strategy", "acc/cmp") else "right", no_wrap=True)
    now = w.seg.step_s
    best = w.best
    same = ("strategy", "bucket_mb", "async_op", "accum", "compress", "world_size", "link")
    for r in sorted(w.rows, key=ranked_s):  # the order the advice ranks them in
        style = "bold" if best is not None and all(r[k] == best[k] for k in same) else ""
        cells = [r["strategy"], f"{r['bucket_mb']:g} MB" if r["bucket_mb"] is not None else "",
                 "yes" if r["async_op"] else "", f"{r['accum']}/{r['compress']}", fmt_s(r["step_s"]) if r["step_s"] is not None else "n/a",
                 fmt_s(r["exposed_comm_s"]), f"{r['overlap']:.0%}",
                 _gain(now - ranked_s(r), now, r["segment"] == w.seg.segment, w.seg.step_se_s)]
        if wide:  # memory per rank by the strategy's formula (metrics.memory.held_by_formula)
            cells.append(f"{r['held_bytes'] / 1e6:.2f}" if r.get("held_bytes") else "")
            cells.append("" if r["measured_step_s"] is None else f"{fmt_s(r['measured_step_s'])} (#{r['segment']})")
        table.add_row(*cells, style=style)
    return table


def _gain(gain: float, now: float, in_force: bool, noise: float) -> Text:
    """What a row saves against the segment in force's measured step ("in force" for its own row)."""
    if in_force or now <= 0:
        return Text("in force" if in_force else "-", style="dim")
    sign = "+" if gain >= 0 else "−"
    return Text(f"{sign}{fmt_s(abs(gain))} ({abs(gain) / now:.0%})", style=GREEN if gain > noise else "")


def _checks(w: WhatIf, width: int) -> list[Text]:
    title = Text("after each switch", style="bold")
    title.append("  the prediction made from the segment before, beside the new segment's measured s/step "
                 "(slowest rank)", style="dim")
    title.truncate(width, overflow="ellipsis")
    lines = [title]
    if w.unchecked:
        lines.append(Text(f"{w.unchecked} switch{'es' if w.unchecked != 1 else ''} without a prediction: no earlier "
                          "segment with sampled steps in view to fit on (a replay's seek brings only the last ones; "
                          "`ddptop advise FILE --segment N` reads them all)", style="dim"))
    if not w.checks:
        return lines + [Text("no switch yet" if not w.unchecked else "", style="dim")]
    for c in w.checks:
        line = Text(f"#{c.segment} {c.config:<18} from #{c.from_segment}: predicted {fmt_s(c.predicted_s)}  ")
        if c.error is None:
            line.append("measured: no measured step yet", style="dim")
        else:
            line.append(f"measured {fmt_s(c.measured_s)}  error ")
            line.append(f"{c.error:+.1%}", style=palette.ORANGE if abs(c.error) > 0.10 else GREEN)
            if c.error_se > 0:  # how far the two means may differ by the segments' step-to-step noise alone
                line.append(f" ±{c.error_se:.1%}", style="dim")
        lines.append(line)
    return lines


def whatif_line(snap: Snapshot) -> str:
    """The overview's few words: the best configuration and its predicted gain ('' before the first fit)."""
    w = snap.whatif
    return "" if w.best is None else f"what-if from #{w.seg.segment}: {describe(w.best)}"
