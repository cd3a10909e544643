"""Provides hints: what one segment's measured numbers say to do, in plain words, each with its numbers and rule.

Pure (no torch). The report and `ddptop info` build a segment's `Inputs` from the report's statistics, the screen
from the live segment table; every number is one that ddptop.metrics (or the report's readings) already defines.
A hint fires only when its condition clears a stated margin, so none fires on noise; `RULES` says each rule in
words (README's "Hints" paragraph is this table).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from ddptop.metrics.buckets import MIB
from ddptop.metrics.traffic import TELEMETRY_BYTES

# name → the rule in words (README lists these). Thresholds are the constants below.
RULES: dict[str, str] = {
    "hot spot": "the strategy communicates and rank 0 moves (sent + received per step) at least 1.5× the mean of the "
                "other ranks, and more than ddptop's own telemetry could explain (64 KB/step per other rank)",
    "one bucket": "DDP holds every gradient in one bucket at the segment's bucket size",
    "exposed communication": "exposed communication is at least 20% of the mean step time; it names the fastest "
                             "configuration as `ddptop advise --segment N` ranks them (fitted on this DDP or "
                             "allreduce segment; one the recording ran by its measurement, else by its prediction) "
                             "when a predicted saving is at least 10% of the step, a measured one more than its "
                             "standard error",
    "data loading": "data loading is at least 20% of the mean step time",
    "link at its rate": "the busiest rank's bytes each way by the wire formulas, over the least communication time "
                        "of any rank, are at least 85% of the link's known rate (silent when the rate is unknown)",
    "accumulation under ZeRO": "zero2 or zero3 with accum K ≥ 2 on 2 ranks or more: FSDP2 all-gathers every unit "
                               "again in each micro-step (zero3 twice), so accumulation saves only the reduce-scatters "
                               "(ddptop turns gradient sync off for the first K−1 micro-steps; a loop that does not "
                               "reduce-scatters in every one too); it names the most any rank sent per step and per "
                               "micro-step",
}
HOT_SPOT_RATIO = 1.5  # gather-scatter puts (N−1)× the bytes on rank 0: 2× at 3 ranks; ring and DDP give 1.0 within
#                       the NIC counters' 0.5% (README's lab table): half again is far from both
EXPOSED_SHARE = 0.20  # a fifth of the step: repeated segments of one configuration differ by a few % here
PREDICTED_SHARE = 0.10  # the what-if model's stated error: its medians reach 10.6% on the committed lab
#                         recordings (README "What-if / advise"), so a smaller saving could be the model's own error
#                         (and is above 5% of the step, what repeated segments of one configuration differ by)
DATA_SHARE = 0.20  # the same margin: a fifth of the step spent waiting for batches is worth a loader process
LINK_SHARE = 0.85  # DDP's one bucket over the lab's 1 Gbit/s links: 87% and 91% (cs744-lab-buckets.db); every
#                    other segment of the committed lab recordings (25 MB buckets, the per-parameter
#                    all-reduce, gather-scatter) 43-75%: 85% sits between with room on both sides


@dataclass(frozen=True)
class Inputs:
    """One segment's numbers, as the report or the screen measured them (means over ranks unless said)."""

    strategy: str
    bucket_mb: float
    world_size: int
    step_s: float  # mean over ranks of their mean step time (metrics.Figures.step_s)
    data_s: float
    comm_s: float
    exposed_comm_s: float
    moved: Mapping[int, tuple[float, float]] = field(default_factory=dict)  # rank → (sent, received) bytes/step
    moved_by: str = "formula"  # "NIC" (each rank's own interface) or "formula" (the wire formulas)
    formula: Mapping[int, tuple[float, float]] = field(default_factory=dict)  # rank → (sent, received) by the formulas
    least_comm_s: float = 0.0  # the least mean communication time of any rank (0: use comm_s)
    gradient_bytes: int = 0
    buckets: tuple[int, ...] = ()  # DDP bucket sizes in bytes, launch order
    buckets_by: str = ""  # "recorded" (DDP's own layout) or "layout" (metrics.buckets from the layer sizes)
    link_bytes_per_s: float | None = None  # each way; None: unknown (then no link hint)
    link_by: str = ""  # where the rate came from ("lab --link 1gbit")
    # (configuration, seconds saved per step, "predicted" or "measured in segment k"): the what-if model's best,
    # ranked by its measurement where the job ran it (whatif.rows.best_row), None where it is no better within noise
    predicted: tuple[str, float, str] | None = None
    accum: int = 1  # micro-steps per optimizer step


@dataclass(frozen=True)
class Hint:
    name: str  # a key of RULES
    text: str  # the hint in plain words, with its numbers
    numbers: Mapping[str, float]  # the numbers it came from
    source: str = ""  # where those numbers came from

    def line(self) -> str:
        return f"{self.text} ({self.source})" if self.source else self.text


def hints(x: Inputs) -> list[Hint]:
    """Every hint whose condition the segment shows, in RULES' order."""
    found = [hot_spot(x), one_bucket(x), exposed(x), data_loading(x), link_rate(x), zero_accumulation(x)]
    return [h for h in found if h is not None]


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.0f} ms" if seconds >= 0.01 else f"{seconds * 1e3:.1f} ms"


def _mb(nbytes: float) -> str:
    """Three significant digits: 36.9 MB, 222 MB, 0.0839 MB."""
    return f"{nbytes / 1e6:.3g} MB"


def hot_spot(x: Inputs) -> Hint | None:
    if 0 not in x.moved or len(x.moved) < 2 or x.comm_s <= 0:  # `single` moves only ddptop's own telemetry
        return None
    total = {r: sent + recv for r, (sent, recv) in x.moved.items()}
    others = [v for r, v in total.items() if r != 0]
    mean_others = sum(others) / len(others)
    if mean_others <= 0:
        return None
    ratio = total[0] / mean_others
    # every rank's telemetry reaches the store on rank 0's host: up to TELEMETRY_BYTES per step from each
    if ratio < HOT_SPOT_RATIO or total[0] - mean_others < TELEMETRY_BYTES * len(others):
        return None
    sent, recv = x.moved[0]
    return Hint("hot spot", f"rank 0 sends and receives {ratio:.1f}× what the others do under {x.strategy} "
                            f"({_mb(total[0])} vs {_mb(mean_others)} per step): it is the hot spot",
                {"ratio": ratio, "rank0_bytes": total[0], "others_bytes": mean_others, "rank0_sent": sent,
                 "rank0_received": recv},
                "NIC counters per rank" if x.moved_by == "NIC" else "the wire formulas: no per-rank NIC counters")


def one_bucket(x: Inputs) -> Hint | None:
    if x.strategy != "ddp" or x.world_size < 2 or len(x.buckets) != 1:
        return None
    size = x.buckets[0] or x.gradient_bytes
    return Hint("one bucket", f"{_mb(size)} of gradients fit one {x.bucket_mb:g} MB bucket: no overlap possible",
                {"gradient_bytes": size, "bucket_mb": x.bucket_mb, "cap_bytes": x.bucket_mb * MIB},
                "DDP's recorded buckets" if x.buckets_by == "recorded" else "the bucket layout from the layer sizes")


def exposed(x: Inputs) -> Hint | None:
    if x.step_s <= 0 or x.comm_s <= 0 or x.exposed_comm_s < EXPOSED_SHARE * x.step_s:
        return None
    of_comm, of_step = x.exposed_comm_s / x.comm_s, x.exposed_comm_s / x.step_s
    text = (f"{of_comm:.0%} of communication is exposed: {_ms(x.exposed_comm_s)} of the {_ms(x.step_s)} step "
            f"({of_step:.0%}) waits for it")
    numbers = {"exposed_s": x.exposed_comm_s, "comm_s": x.comm_s, "step_s": x.step_s, "of_comm": of_comm,
               "of_step": of_step}
    source = "mean over ranks"
    config, saved_s, by = x.predicted or ("", 0.0, "")
    if by == "predicted" and saved_s >= PREDICTED_SHARE * x.step_s:  # past the model's own error
        text += f"; {config} is predicted to save {_ms(saved_s)}/step ({saved_s / x.step_s:.0%})"
        numbers.update(predicted_saving_s=saved_s, predicted_share=saved_s / x.step_s)
        source += "; the saving: the what-if model fitted on this segment, as ddptop advise --segment prints it"
    elif by.startswith("measured") and saved_s > 0:  # a measurement, already past its noise (best_row's verdict)
        text += f"; {config} {by} took {_ms(saved_s)}/step less ({saved_s / x.step_s:.0%})"
        numbers.update(measured_saving_s=saved_s, measured_share=saved_s / x.step_s)
        source += "; the saving: the two segments' measured step times, as ddptop advise --segment ranks them"
    return Hint("exposed communication", text, numbers, source)


def data_loading(x: Inputs) -> Hint | None:
    if x.step_s <= 0 or x.data_s < DATA_SHARE * x.step_s:
        return None
    share = x.data_s / x.step_s
    return Hint("data loading", f"data loading is {share:.0%} of the step ({_ms(x.data_s)} of {_ms(x.step_s)}): "
                                "add --workers N (loader processes per rank)",
                {"data_s": x.data_s, "step_s": x.step_s, "share": share}, "mean over ranks")


def link_rate(x: Inputs) -> Hint | None:
    # the formulas' bytes: what the collectives must put on the link, never more than it carried while they ran
    # (a NIC also counts ddptop's telemetry, sent between collectives too: a 2-host lab at 5 Mbit/s counted
    # 93-105 KB a step for the ring's 84 KB, "111% of the rate"). Over the least communication time of any rank:
    # the one that reached each collective last waited least, so its communication is the transfer itself
    comm_s = x.least_comm_s or x.comm_s
    if not x.link_bytes_per_s or comm_s <= 0 or not x.formula:
        return None
    rank, (sent, recv) = max(x.formula.items(), key=lambda kv: max(kv[1]))
    share = max(sent, recv) / comm_s / x.link_bytes_per_s
    if share < LINK_SHARE:
        return None
    return Hint("link at its rate", f"rank {rank}'s link carries {share:.0%} of its rate while communicating: the "
                                    "network is the bottleneck",
                {"share": share, "bytes": max(sent, recv), "comm_s": comm_s, "rate_bytes_per_s": x.link_bytes_per_s,
                 "rank": rank},
                f"the wire formulas' bytes each way per step / the least communication time of any rank / "
                f"{x.link_by}")


def zero_accumulation(x: Inputs) -> Hint | None:
    """Accumulation that saves little communication: a 4-micro-step FSDP run took 430.6 s against 110.2 s a step
    (cosmos-framework#161), each micro-step moving what a step did."""
    if x.strategy not in ("zero2", "zero3") or x.accum < 2 or x.world_size < 2 or not x.moved:
        return None
    rank, (sent, _) = max(x.moved.items(), key=lambda kv: kv[1][0])
    if sent <= 0:
        return None
    micro = sent / x.accum
    gathers = "twice (forward and backward)" if x.strategy == "zero3" else "in its forward"
    return Hint("accumulation under ZeRO",
                f"accum {x.accum} under {x.strategy} saves little communication: rank {rank} sent {_mb(sent)} a "
                f"step, {_mb(micro)} each micro-step: every micro-step all-gathers each unit again ({gathers}), only "
                "the reduce-scatter runs once a step; DDP or zero1 with accumulation all-reduce once a step",
                {"accum": x.accum, "rank": rank, "step_bytes": sent, "micro_step_bytes": micro},
                "NIC counters per rank" if x.moved_by == "NIC" else "the wire formulas: no per-rank NIC counters")

