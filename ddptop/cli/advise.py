"""`ddptop advise FILE`: the what-if model fitted on one segment of a recording, every other configuration
predicted, each beside the recording's own measurement where it ran."""

from __future__ import annotations

import json
from typing import Sequence

from ddptop.cli.parser import Parser
from ddptop.errors import UsageError


def parser() -> Parser:
    p = Parser(prog="ddptop advise", description="Predict step time, exposed communication and overlap for every "
               "strategy, DDP bucket size, async_op, world size and link from one segment of a recording.")
    p.add_argument("file", metavar="FILE")
    p.add_argument("--segment", type=int, metavar="N", help="the segment to fit on (default: the first DDP one)")
    p.add_argument("--json", action="store_true",
                   help='one JSON object: {"from_segment": N, "predictions": [...], "best": {...}}')
    p.add_argument("--buckets", metavar="MB,...", default="1,5,10,25,50,100",
                   help="DDP bucket sizes (1,5,10,25,50,100)")
    p.add_argument("--world-sizes", metavar="N,...",
                   help="world sizes to predict (weak scaling; default: the recording's)")
    p.add_argument("--link", metavar="RATE", help="the link the recording ran on (`ddptop lab --link` values); "
                   "needed for --links")
    p.add_argument("--links", metavar="RATE,...", help="other links to predict: 100mbit,10gbit,unlimited")
    p.add_argument("--accum", metavar="K,...", help="gradient accumulation to predict for the fitted configuration "
                   "(1,4,8; default: the values the recording ran)")
    p.add_argument("--compress", metavar="C,...", help="gradient compression to predict for the fitted "
                   "configuration (none,fp16,bf16,powersgd:R; default: the ones the recording ran)")
    return p


def _settings(args) -> list[tuple[int, str]]:
    """--accum × --compress: the (accum, compress) pairs to predict beside those the recording ran."""
    from ddptop.metrics.whatif.settings import COMPRESSIONS

    accums = _numbers(args.accum, int, "--accum", 1) or [1]
    compresses = [c.strip() for c in (args.compress or "none").split(",") if c.strip()]
    for c in compresses:
        family, _, rank = c.partition(":")
        bad_rank = rank and (family != "powersgd" or not rank.isdigit() or int(rank) < 1)
        if family not in COMPRESSIONS or bad_rank:
            raise UsageError(f"--compress takes none, fp16, bf16 or powersgd[:R], got {c!r}")
    if not args.accum and not args.compress:
        return []
    return [(k, c) for k in accums for c in compresses]


def _numbers(text: str | None, kind, flag: str, low: float) -> list:
    if not text:
        return []
    try:
        values = [kind(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise UsageError(f"{flag} takes comma-separated numbers, got {text!r}") from None
    if not values or any(not v >= low or v > 1e6 for v in values):
        raise UsageError(f"{flag} takes numbers ≥ {low:g}, got {text!r}")
    return values


def _rate(text: str) -> float:
    from ddptop.lab.links import parse_link

    bits = parse_link(text).bits_per_s
    return 0.0 if bits is None else bits


def cmd_advise(argv: Sequence[str]) -> int:
    args = parser().parse_args(argv)
    buckets = _numbers(args.buckets, float, "--buckets", 0.001)
    worlds = _numbers(args.world_sizes, int, "--world-sizes", 1)
    settings = _settings(args)
    links: list[float | None] = [None] + [_rate(r) for r in (args.links or "").split(",") if r.strip()]
    if len(links) > 1 and not args.link:
        raise UsageError("--links needs --link: the rate the recording ran on, to tell the link from the CPU")
    from ddptop.cli.recordings import emit, reading
    from ddptop.record.whatif import predictions

    with reading(args.file) as rec:
        seg, rows = predictions(rec, args.segment, _rate(args.link) if args.link else None, buckets, worlds, links,
                                args.links and args.link, settings=settings)
    from ddptop.metrics.whatif.rows import fitted_constants

    out = {"from_segment": seg.segment, "predictions": rows, "best": best(rows, seg, rows[0]["link"]),
           "constants": fitted_constants(seg)}
    emit(json.dumps(out, indent=1) if args.json else render({**out, "link": rows[0]["link"]}, seg))
    return 0


def best(rows: list[dict], seg, link: str | None) -> dict:
    """rows.best_row among the rows on the recording's own link, world size and accum (the one rule the screen and
    the report use: measured where the recording ran it, else predicted; a gain inside the noise is none)."""
    from ddptop.metrics.whatif.rows import best_row, same_step

    as_run = [r for r in rows if r["world_size"] == seg.world_size and r["link"] == link and same_step(r, seg)]
    return best_row(as_run or rows, seg)


def render(out: dict, seg) -> str:
    """The table, best first (each row by its measurement where the recording ran it, else its prediction), with
    the fitted segment's line and out["best"]'s gain, or why there is none."""
    from ddptop.metrics.whatif.model import fit
    from ddptop.metrics.whatif.rows import config_name, error_se, ranked_s

    def fit_constants(seg):
        return fit(seg).constants
    from ddptop.record.whatif import name as _name

    rows = sorted(out["predictions"], key=ranked_s)  # the order the advice ranks them in
    fitted = config_name(seg.config)
    noise = (f" ± {seg.step_se_s:.3f} (the standard error of its steps: every prediction carries it)"
             if seg.step_se_s > 0 else "")
    lines = [f"fitted on segment {seg.segment} ({fitted}, {seg.world_size} ranks): measured {seg.step_s:.3f} s/step"
             + noise,
             f"{'configuration':30} {'accum':>5} {'compress':>11} {'ranks':>5} {'link':>9} {'s/step':>8} "
             f"{'exposed':>8} {'overlap':>7} {'MB/rank':>8} "
             f"{'measured':>9} {'error':>7} {'±noise':>7}"]
    for r in rows:
        measured = f"{r['measured_step_s']:.3f}" if r["measured_step_s"] is not None else "–"
        error = spread = "–"
        if r["measured_step_s"] and r["step_s"] is not None:
            error = f"{100 * (r['step_s'] - r['measured_step_s']) / r['measured_step_s']:+.1f}%"
        if r["measured_step_s"] and r["segment"] != seg.segment:  # the fitted row is exact by construction
            spread = f"{100 * error_se(r['step_se_s'], r['measured_step_se_s'], r['measured_step_s']):.1f}%"
        # every row says its accum and compression in their own columns, 1 and none too (the screen's acc/cmp)
        plain = _name({**r, "accum": 1, "compress": "none"})
        step = "n/a" if r["step_s"] is None else f"{r['step_s']:.3f}"
        lines.append(f"{plain:30} {r['accum']:>5} {r['compress']:>11} {r['world_size']:>5} "
                     f"{r['link'] or 'as run':>9} {step:>8} "
                     f"{r['exposed_comm_s']:>8.3f} {100 * r['overlap']:>6.0f}% {r['held_bytes'] / 1e6:>8.2f} "
                     f"{measured:>9} {error:>7} {spread:>7}")
    lines += [f"  {r['n_a']} ({_name(r)}, {r['world_size']} ranks)" for r in rows if r["step_s"] is None]
    lines += ["constants (each fitted on the segment where it can tell, else where it came from):"]
    lines += [f"  {c.describe()}" for c in fit_constants(seg)]
    best = out["best"]
    gain, ranks = best["saving_s"], best["world_size"]
    if best["verdict"] == "in force":
        lines.append(f"best at {ranks} ranks: {fitted}, the configuration in force: no other is faster "
                     "(measured where the recording ran it, else predicted)")
        return "\n".join(lines)
    by = f"measured in segment {best['segment']}" if best["by"] == "measured" else "predicted"
    said = (f"{_name(best)}, {ranked_s(best):.3f} s/step {by}: {'saves' if gain >= 0 else 'costs'} "
            f"{abs(gain):.3f} s/step ({100 * abs(gain) / seg.step_s:.0f}%) against the measured segment")
    if best["verdict"] == "noise":
        lines.append(f"best at {ranks} ranks: no better within noise: {said}, inside its ±{best['noise_s']:.3f} "
                     f"s/step; {fitted} stays")
    else:
        lines.append(f"best at {ranks} ranks: {said}")
    return "\n".join(lines)
