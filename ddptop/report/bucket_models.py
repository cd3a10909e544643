"""Per-iteration latency against DDP bucket size, one line per model (the CS744 lecture notes' figures 7-8:
ResNet-50 and BERT), from a report over several recordings, and what it says beside the lecture's finding.

Drawn when the report's DDP segments sweep the bucket size for at least two models (one recording per model: a
run has one model). A size run in several segments (rounds) is one point, its segments pooled (`pooled`, the
weighting every bucket finding uses); each round is drawn too, and a difference is stated only beyond the rounds'
spread (`noise_share`, the report's one noise rule).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from ddptop.report import plot
from ddptop.report.analysis import SegmentStats, pooled
from ddptop.report.figures import Made
from ddptop.report.hints import link_rate
from ddptop.report.sweeps import noise_share

LECTURE = "the CS744 lecture notes on PyTorch DDP (figures 7-8: ResNet-50 and BERT on gloo and NCCL, 16 and 32 GPUs)"
BERT = "bert-mini"  # the lecture's BERT, scaled down (ddptop.train.models.BERT_MINI)
LARGE_MB = 25.0  # PyTorch's default bucket_cap_mb, the lecture's "middle = 25 MB": a larger bucket is "larger"


@dataclass(frozen=True)
class Line:
    """One model's sweep: each bucket size's pooled step time and its rounds."""

    model: str
    sizes: list[float]
    step_s: list[float]  # the slowest rank's mean step time, the size's segments pooled by measured steps
    rounds: list[list[float]]  # each segment's own mean step time, per size
    noise: float  # how far one size's rounds land apart, as a share (noise_share)
    grad_mb: float  # the model's gradients (every parameter, fp32): what one bucket can hold at most
    largest_bucket_mb: list[float]  # per size, DDP's largest recorded bucket (0: not recorded)

    @property
    def fastest(self) -> float:
        return self.sizes[self.step_s.index(min(self.step_s))]

    def near_best(self, size: float) -> bool:
        """Within the noise of this model's fastest size."""
        best = min(self.step_s)
        return self.step_s[self.sizes.index(size)] <= best * (1 + self.noise)

    @property
    def spread(self) -> float:
        return (max(self.step_s) - min(self.step_s)) / min(self.step_s) if min(self.step_s) > 0 else 0.0


def lines(stats: list[SegmentStats], models: dict[str, str]) -> list[Line]:
    """Per model (`models`: a run's label → its model), its DDP segments' step time per bucket size; [] unless at
    least two models each ran at least two sizes (at one batch size and learning rate)."""
    found = []
    for label, model in models.items():
        ddp = [s for s in stats if s.label == label and s.config.strategy == "ddp"]
        ddp = [s for s in ddp if (s.config.batch_size, s.config.lr) == (ddp[0].config.batch_size, ddp[0].config.lr)]
        sizes = sorted({s.config.bucket_mb for s in ddp})
        if len(sizes) < 2:
            continue
        same = [[s for s in ddp if s.config.bucket_mb == size] for size in sizes]
        found.append(Line(model if list(models.values()).count(model) == 1 else f"{model} ({label})", sizes,
                          [pooled(g, "mean_step_s") for g in same], [[s.mean_step_s for s in g] for g in same],
                          noise_share(ddp), ddp[0].param_bytes / 1e6,
                          [max((max(s.buckets_mb, default=0.0) for s in g), default=0.0) for g in same]))
    return found if len(found) > 1 else []


def setup(runs) -> str:
    """Where the runs ran, from their recordings: ranks, device, backend and threads (the hosts line), the link."""
    places = sorted({m.groups() for run in runs for host in run.provenance.get("hosts", [])
                     for m in [re.search(r"\((\w+), (\w+), (\d+) thread", host)] if m})
    where = "; ".join(f"{device} with {threads} compute thread{'s' if threads != '1' else ''}, {backend}"
                      for device, backend, threads in places) or "?"
    worlds = sorted({run.world_size for run in runs})
    rates = sorted({8 * rate for rate in (link_rate(run.link)[0] for run in runs) if rate is not None})
    link = f", each host's link shaped to {' / '.join(f'{r / 1e9:g}' for r in rates)} Gbit/s" if rates else ""
    return f"{' / '.join(map(str, worlds))} ranks, {where}{link}"


def figure(stats: list[SegmentStats], models: dict[str, str], setup: str, out: Path) -> Made | None:
    found = lines(stats, models)
    if not found:
        return None
    fig, (ax,) = plot.figure(width=9.0, height=4.2)
    for j, line in enumerate(found):
        ax.plot(line.sizes, line.step_s, marker="o", color=plot.color(j), label=line.model)
        xs = [size for size, r in zip(line.sizes, line.rounds) for _ in r]
        ax.plot(xs, [v for r in line.rounds for v in r], linestyle="none", marker="x", markersize=6,
                color=plot.color(j), alpha=0.7, label=f"{line.model}: rounds")
    sizes = sorted({size for line in found for size in line.sizes})
    ax.set_xscale("log")
    ax.set_xticks(sizes, [f"{size:g}" for size in sizes])
    ax.minorticks_off()
    ax.set_xlabel("DDP bucket size, bucket_cap_mb (MB, log scale)")
    ax.set_ylabel("seconds per iteration")
    ax.set_ylim(0, 1.1 * max(v for line in found for r in line.rounds for v in r))
    ax.set_title(f"slowest rank's mean step time (line: a size's rounds pooled, ×: each round)\n{setup}",
                 fontsize=9)
    plot.legend_outside(ax)
    data = plot.save(fig, out, "bucket_models", "Per-iteration latency vs bucket size, per model")
    return Made("bucket_models", "Per-iteration latency vs bucket size, per model", data,
                finding(found, setup))


def _joined(line: Line) -> str:
    return ", ".join(f"{size:g} MB {step:.3g}" for size, step in zip(line.sizes, line.step_s))


def _best(line: Line) -> str:
    if line.spread <= line.noise:
        return (f"no size faster than the noise ({100 * line.spread:.0f}% apart, a size's rounds up to "
                f"{100 * line.noise:.0f}%)")
    return f"fastest at {line.fastest:g} MB, the slowest size {100 * line.spread:.0f}% slower (rounds within " \
           f"{100 * line.noise:.0f}%)"


def finding(found: list[Line], setup: str) -> str:
    """Each model's sweep, then — with bert-mini among them — the lecture's finding beside it, claim by claim."""
    text = " ".join(f"{line.model}: {_joined(line)} s/iteration; {_best(line)}." for line in found)
    bert = next((line for line in found if line.model == BERT), None)
    others = [line for line in found if line is not bert]
    if bert is None or not others:
        return text
    other = others[0]
    return text + " " + lecture(bert, other, setup)


def lecture(bert: Line, other: Line, setup: str) -> str:
    """The lecture's three claims ("BERT latencies are higher", "larger buckets work well for BERT", the best size
    depends on the model), each said to agree or not by this run's numbers, and why where it does not."""
    mean = {line.model: sum(line.step_s) / len(line.step_s) for line in (bert, other)}
    higher = mean[bert.model] > mean[other.model] * (1 + max(bert.noise, other.noise))
    parts = [f"Beside {LECTURE}: \"BERT latencies are higher\" — "
             + (f"agrees: {bert.model} {mean[bert.model]:.3g} s against {other.model}'s {mean[other.model]:.3g} s "
                "(mean over sizes)." if higher else
                f"does not hold here: {bert.model} {mean[bert.model]:.3g} s against {other.model}'s "
                f"{mean[other.model]:.3g} s (mean over sizes), for bert-mini is BERT scaled down to "
                f"{bert.grad_mb:.3g} MB of gradients against {other.model}'s {other.grad_mb:.3g} MB (BERT-base: "
                "~440 MB).")]
    parts.append("\"larger buckets work well for BERT\" — " + _larger(bert))
    split, rest = bert.largest_bucket_mb[0], bert.grad_mb - bert.largest_bucket_mb[0]
    if split > 0:
        parts.append(f"At {bert.sizes[0]:g} MB {bert.model}'s largest bucket is still {split:.3g} MB: the token "
                     f"embedding's gradient, one tensor that no bucket size splits and the last the backward pass "
                     f"makes; a bucket size only decides how finely the other {rest:.3g} MB is cut.")
    depends = (bert.spread > bert.noise or other.spread > other.noise) and not (
        bert.near_best(other.fastest) and other.near_best(bert.fastest))
    parts.append("The best bucket size depends on the model — "
                 + (f"agrees: {other.model} {_short(other)}, {bert.model} {_short(bert)}." if depends else
                    f"not shown here: {other.model} {_short(other)}, {bert.model} {_short(bert)}, each model's best "
                    "size within the noise of the other's."))
    parts.append(f"The set-up differs from the lecture's: {setup}, where the lecture ran 16 and 32 GPUs (whose "
                 "all-reduce runs beside the compute, on NCCL or gloo); the absolute times and the link's share of a "
                 "step are this machine's.")
    return " ".join(parts)


def _larger(bert: Line) -> str:
    """Whether this run's bert-mini is fastest at a large bucket (≥ LARGE_MB), beyond the noise."""
    if bert.spread <= bert.noise:
        return f"not shown here: {bert.model} is {_best(bert)}."
    near = [size for size in bert.sizes if size != bert.fastest and bert.near_best(size)]
    tie = f" ({', '.join(f'{size:g}' for size in near)} MB within the noise of it)" if near else ""
    if bert.fastest >= LARGE_MB:
        return f"agrees: {bert.model} is fastest at {bert.fastest:g} MB{tie}."
    if any(size >= LARGE_MB for size in near):
        return f"in part: {bert.model} is fastest at {bert.fastest:g} MB{tie}."
    slower = min(bert.step_s[i] for i, size in enumerate(bert.sizes) if size >= LARGE_MB) / min(bert.step_s) - 1
    return (f"does not hold here: {bert.model} is fastest at {bert.fastest:g} MB{tie}, and every size of "
            f"{LARGE_MB:g} MB and more is at least {100 * slower:.0f}% slower, beyond the noise.")


def _short(line: Line) -> str:
    return f"fastest at {line.fastest:g} MB" if line.spread > line.noise else "flat within the noise"
