"""The accumulation and compression figure (issue 25): per segment, the step time, what the network interfaces
counted per optimizer step and per sample, and the training loss after the same number of samples. Drawn only when
the segments shown differ in `accum` or `compress`: compression trades bytes for accuracy, and both are shown."""

from __future__ import annotations

import math
import os
from pathlib import Path

from ddptop.report import markdown, plot
from ddptop.report.analysis import SegmentStats
from ddptop.report.figures import Made
from ddptop.report.sweeps import _grouped

NAN = float("nan")


def samples_per_step(s: SegmentStats) -> int:
    """Samples one rank trains per optimizer step: accum micro-steps of batch_size (the glossary's step)."""
    return s.config.batch_size * s.config.accum


def nic_per_sample_kb(s: SegmentStats) -> float:
    """KB a host's network interface sent per sample its rank trained (NaN: the NIC could not be told per step)."""
    if s.nic_sent_mb_per_step is None:
        return NAN
    return s.nic_sent_mb_per_step * 1e3 / samples_per_step(s)


def loss_after(stats: list[SegmentStats], points: dict[str, list]) -> tuple[int, list[float]]:
    """(samples per rank, the mean loss over ranks at the step where each segment had trained that many since its
    start): the fewest any segment shown trained, so every segment is read at the same number of samples. `points`:
    each run's label → its loss points (runs.StepPoint); NaN where the point is not there."""
    samples = min(s.length * samples_per_step(s) for s in stats)
    losses = []
    for s in stats:
        step = s.first_step + math.ceil(samples / samples_per_step(s)) - 1
        found = [p.loss for p in points.get(s.label, []) if p.step == step]
        losses.append(found[0] if found else NAN)
    return samples, losses


def _two_lines(stats: list[SegmentStats], names: list[str]) -> list[str]:
    """Each name as its run (the labels' common prefix left out: hpml-lab4-q4-b128 → b128) over its setting, so
    that names of several runs fit under their bars unrotated."""
    labels = [s.label for s in stats]
    if len(set(labels)) < 2:
        return names
    common = os.path.commonprefix(labels)
    cut = max(common.rfind("-"), common.rfind("_")) + 1  # at a word's end: hpml-lab4-q4-b128, -b1024 → b128, b1024
    return [f"{s.label[cut:] or s.label}\n{n[len(s.label):].strip()}" if n.startswith(s.label) else n
            for s, n in zip(stats, names)]


def accum_compress(stats: list[SegmentStats], names: list[str], points: dict[str, list], out: Path) -> Made | None:
    if len({(s.config.accum, s.config.compress) for s in stats}) < 2:
        return None
    names = _two_lines(stats, names)
    fig, (a, b, c, d) = plot.figure(4, 1, width=9.0, height=2.6)
    _grouped(a, names, [("step (slowest rank)", [s.mean_step_s for s in stats], [s.step_p10 for s in stats],
                         [s.step_p90 for s in stats])], "seconds per step")
    a.set_title("optimizer step time (accum micro-steps, one sync)", fontsize=9)
    nic = [NAN if s.nic_sent_mb_per_step is None else s.nic_sent_mb_per_step for s in stats]
    _grouped(b, names, [("NIC: counted", nic, None, None),
                        ("formula", [s.sent_mb_per_step for s in stats], None, None)], "MB sent per step")
    b.set_title("bytes per optimizer step: each host's network interface (mean over hosts), and the formula", fontsize=9)
    _grouped(c, names, [("NIC: counted", [nic_per_sample_kb(s) for s in stats], None, None),
                        ("formula", [s.sent_mb_per_step * 1e3 / samples_per_step(s) for s in stats], None, None)],
             "KB sent per sample")
    c.set_title("bytes per sample: a host's NIC bytes over the samples its rank trained (batch × accum per step)",
                fontsize=9)
    samples, losses = loss_after(stats, points)
    _grouped(d, names, [(f"after {samples} samples per rank", losses, None, None)], "training loss")
    d.set_title("training loss (mean over ranks) after the same number of samples since the segment began",
                fontsize=9)
    notes = []
    if any(v != v for v in nic):
        notes.append("n/a: no NIC bytes per step (ranks sharing a loopback, or no two network samples between steps).")
    for ax in (a, b, c, d):
        plot.categories(ax, names, rotate=max(len(line) for n in names for line in n.split("\n")) * len(names) > 70)
    if len({s.label for s in stats}) < len(stats):
        notes.append("Segments of one job train one model in turn: a later segment starts from a lower loss.")
    if notes:
        plot.note(fig, " ".join(notes))
    data = plot.save(fig, out, "accum_compress", "Accumulation and compression: time, bytes and loss")
    flat = [n.replace("\n", " ") for n in names]
    return Made("accum_compress", "Accumulation and compression", data, _finding(stats, flat, samples, losses))


def _finding(stats: list[SegmentStats], names: list[str], samples: int, losses: list[float]) -> str:
    base = next((i for i, s in enumerate(stats) if s.config.accum == 1 and s.config.compress == "none"), None)
    if base is None or stats[base].nic_sent_mb_per_step is None:
        text = "Against the formulas: " + "; ".join(f"{n} {s.sent_mb_per_step:.3g} MB per step" for s, n in
                                                      zip(stats, names))
    else:
        ref = stats[base]
        parts = []
        for i, (s, n) in enumerate(zip(stats, names)):
            if i == base or s.nic_sent_mb_per_step is None:
                continue
            parts.append(f"{n} {s.nic_sent_mb_per_step / ref.nic_sent_mb_per_step:.2f}× per step, "
                         f"{nic_per_sample_kb(s) / nic_per_sample_kb(ref):.2f}× per sample, "
                         f"{s.mean_step_s / ref.mean_step_s:.2f}× the step time")
        text = f"Against {names[base]} (NIC bytes, counted): " + "; ".join(parts)
    drawn = [(v, n) for v, n in zip(losses, names) if v == v]
    if drawn:
        text += (f". Training loss after {samples} samples per rank: "
                 + ", ".join(f"{n} {v:.3g}" for v, n in drawn))
    return text + "."


def large_batch_blocks(runs: list, shown: list[list[SegmentStats]]) -> list[tuple]:
    """HPML Lab 4 Q4: runs of one segment each that trained the same samples at different global batches (b·K·N),
    side by side at their last epoch: training loss (mean over ranks and the epoch's steps), test accuracy (every
    rank's shard), the gap to the smallest batch and the share of the large batch's gap a remedy closed."""
    rows = [_large_batch_row(run, kept[0]) for run, kept in zip(runs, shown) if len(kept) == 1 and run.evals]
    if len(rows) < 2 or len({r["batch"] for r in rows}) < 2 or len({r["samples"] for r in rows}) > 1:
        return []
    base = min(rows, key=lambda r: r["batch"])
    plain = next((r for r in rows if r["batch"] > base["batch"] and r["lr"] == base["lr"] and not r["warmup"]), None)
    table = []
    for r in rows:
        closed = "–"
        if plain is not None and r is not plain and r["batch"] == plain["batch"]:
            whole = base["accuracy"] - plain["accuracy"]
            closed = f"{100 * (r['accuracy'] - plain['accuracy']) / whole:.0f}%" if whole > 0 else "–"
        table.append([markdown.untrusted(r["name"]), f"{r['batch']}", f"{r['lr']:g}", f"{r['warmup'] or '–'}",
                      f"{r['samples']}", f"{r['epoch'] + 1}", f"{r['loss']:.3f}", f"{100 * r['accuracy']:.1f}%",
                      f"{r['loss'] - base['loss']:+.3f}", f"{100 * (r['accuracy'] - base['accuracy']):+.1f}", closed])
    return [("h2", "Large batches (HPML Lab 4 Q4)"),
            ("p", f"Every run trained the same {base['samples']} samples from a fresh model. At the last epoch: the "
                  "training loss (mean over ranks and the epoch's steps), the test accuracy (every rank's shard of "
                  f"the test set), both against the smallest global batch ({base['batch']}); *gap closed*: the "
                  "share of the large batch's accuracy gap (same lr, no warm-up) that a remedy (the linear scaling "
                  "rule: lr × the batch ratio; gradual warm-up: lr·(k+1)/N over the first N steps) won back."),
            ("table", ["run", "global batch", "lr", "warm-up steps", "samples", "epoch", "training loss",
                       "test accuracy", "loss vs smallest", "accuracy vs smallest (pp)", "gap closed"], table)]


def _large_batch_row(run, s: SegmentStats) -> dict:
    """One run's last epoch: its steps are the last steps_per_epoch of the run (steps at the segment's batch)."""
    per_epoch = max(1, run.steps_per_epoch)
    last = max(p.step for p in run.points)
    epoch = [p.loss for p in run.points if p.step > last - per_epoch]
    step, accuracy, _ = run.evals[-1]
    return {"name": run.name, "batch": samples_per_step(s) * s.world_size, "lr": s.config.lr,
            "warmup": s.config.lr_warmup_steps, "samples": (last + 1) * samples_per_step(s) * s.world_size,
            "epoch": len(run.evals) - 1, "loss": sum(epoch) / len(epoch), "accuracy": accuracy}
