"""The report's markdown: what ran, the per-segment table, the figures, how to read them."""

from __future__ import annotations

from ddptop.report.analysis import Scaling, SegmentStats

COLUMNS = ("segment", "config", "ranks", "steps", "mean s/step (slowest rank)", "median s/step (slowest rank)",
           "mean s/step (mean over ranks)", "img/s", "compute s", "comm s", "exposed comm s", "overlap %",
           "ddptop ms/step", "other s", "MB sent/step (formula)", "MB recv/step (formula)", "MB sent/step (NIC)",
           "MB recv/step (NIC)", "CPU %", "RSS MB", "all-reduce GB/s", "final loss")


def _opt(value: float | None, fmt: str) -> str:
    return "–" if value is None else format(value, fmt)


def row(s: SegmentStats) -> list[str]:
    return [f"{s.label} {s.index}".strip(), s.config.describe(), str(s.world_size), str(s.measured_steps),
            f"{s.mean_step_s:.4f}", f"{s.median_step_s:.4f}", f"{s.mean_rank_step_s:.4f}", f"{s.images_per_s:.1f}",
            f"{s.compute_s:.4f}", f"{s.comm_s:.4f}", f"{s.exposed_comm_s:.4f}", f"{100 * s.overlap:.1f}",
            f"{s.own_s * 1e3:.2f}", f"{s.other_s:.4f}", f"{s.sent_mb_per_step:.2f}",
            f"{s.recv_mb_per_step:.2f}", _opt(s.nic_sent_mb_per_step, ".2f"), _opt(s.nic_recv_mb_per_step, ".2f"),
            _opt(s.cpu_percent, ".0f"), _opt(s.rss_mb, ".0f"), _opt(s.allreduce_gbps, ".3f"), f"{s.final_loss:.4f}"]


def table(stats: list[SegmentStats]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(row(s)) + " |" for s in stats]
    return "\n".join(lines)


def scaling_table(rows: list[Scaling]) -> str:
    lines = ["| config | ranks | img/s | speedup | efficiency |", "|---|---|---|---|---|"]
    lines += [f"| {r.config} | {r.world_size} | {r.images_per_s:.1f} | {r.speedup:.2f}× | {100 * r.efficiency:.0f}% |"
              for r in rows]
    return "\n".join(lines)


def document(runs: list[dict], stats: list[SegmentStats], figures: list[tuple[str, str]],
             rows: list[Scaling]) -> str:
    parts = ["# ddptop report", ""]
    for run in runs:
        parts.append(f"- **{run['label'] or run['path']}**: `{run['path']}` — {run['model']} on {run['dataset']}, "
                     f"{run['world_size']} ranks ({run['source']}), {run['duration']:.0f} s, "
                     f"{run['segments']} segment(s), warm-up steps dropped per segment: {run['warmup']}")
    parts += ["", "## Per segment", "", table(stats), "",
              "Step time: wall clock from one step boundary to the next (README glossary), for the slowest rank "
              "and the mean over ranks; each segment's warm-up steps and its sampled steps (layer hooks) are left "
              "out; compute, communication, overlap, ddptop's own cost and other are means over ranks; "
              "*formula* bytes follow the algorithm (ring all-reduce 2(N−1)/N·S each way; gather+scatter "
              "(N−1)·S in and out at rank 0, S at the others); *NIC* bytes are what each rank's network "
              "interface counted over the same steps (– when all ranks share one machine's loopback). "
              "All-reduce GB/s is the ring formula's bus bandwidth: 2(N−1)/N·S divided by the measured "
              "communication time (HPML Lab 4, Q3.2).", ""]
    if rows:
        parts += ["## Scaling", "", scaling_table(rows), "",
                  "Weak scaling: the batch per rank stays fixed, so ideal speedup equals the rank ratio.", ""]
    parts += ["## Figures", ""]
    parts += [f"### {title}\n\n![{title}]({name})\n" for title, name in figures]
    return "\n".join(parts)
