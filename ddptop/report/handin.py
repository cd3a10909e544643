"""What a CS744 student hands in from a report: which part each segment is, where each question's answer is, and how
precise the run's short measurement is (issue 26). Only for runs of a `cs744-*` profile."""

from __future__ import annotations

from ddptop.report.analysis import SegmentStats, rounds_spread
from ddptop.report.markdown import untrusted
from ddptop.report.runs import RunData

COURSE_STEPS = 39  # the course averages iterations 1-39 of 40: the first is left out as warm-up
# strategy → (part, what the assignment asks of it, where this report answers it)
PARTS = {
    "single": ("Part 1", "one node, batch 256: time per iteration and the loss",
               "*Beside the published figures* (s/step), figures *Iteration time per configuration* and *Loss and "
               "accuracy per step*"),
    "gather-scatter": ("Part 2a", "gather + scatter through rank 0: time per iteration, node 0's network traffic",
                       "*Beside the published figures*, figures *Bytes per step* and *Network per node over time* "
                       "(node 0 carries (N−1)·S each way), and `lab.md`'s bytes per host"),
    "allreduce": ("Part 2b", "all_reduce per parameter: time per iteration, traffic against part 2a",
                  "*Beside the published figures*, figures *Bytes per step* and *Network per node over time* "
                  "(2(N−1)/N·S on every host)"),
    "ddp": ("Part 3", "DDP (25 MB buckets): time per iteration, and all four parts compared",
            "*Beside the published figures* (speedups over part 1, the order), figures *Beside the published "
            "figures* and *Compute vs communication* (what DDP's overlap hides)"),
}


def blocks(run: RunData, stats: list[SegmentStats], compared: bool = True) -> list[tuple]:
    """The hand-in section for one run, or nothing when its profile is not a CS744 one. `compared`: the page has
    the run's *Beside the published figures* (else its times are in the *Per segment* table)."""
    if not str(run.provenance.get("profile") or "").startswith("cs744"):
        return []
    rows = []
    for strategy, (part, asks, where) in PARTS.items():
        mine = [s for s in stats if s.config.strategy == strategy]
        if not compared:
            where = where.replace("*Beside the published figures* (speedups over part 1, the order), figures "
                                  "*Beside the published figures* and", "*Per segment*, figure")
            where = where.replace("*Beside the published figures*", "*Per segment*")
        if mine:
            rows.append([part, asks, ", ".join(str(s.index) for s in mine), where])
    if not rows:
        return []
    out = [("h2", "Handing in (CS744 assignment 2)"),
           ("p", "Which segment is which part of the assignment, and where this report answers what the part asks."),
           ("table", ["part", "what it asks", "segments", "where the answer is"], rows),
           ("p", precision(stats))]
    if run.dataset == "synthetic":
        out.append(("p", "The run trained on ddptop's synthetic set: step times and bytes do not depend on the data, "
                         "but loss and accuracy are not CIFAR-10's. With the CIFAR-10 files you have: add "
                         "`--dataset cifar10 --data-dir DIR` (the folder holding `cifar-10-batches-py/`; nothing is "
                         "downloaded into a folder you did not name; docs/how-to/hand-in.md)."))
    return out


def precision(stats: list[SegmentStats]) -> str:
    steps = sorted({s.measured_steps for s in stats})
    text = (f"This run averaged {', '.join(map(str, steps))} measured step(s) per segment; the course averages "
            f"{COURSE_STEPS} (iterations 1-39). ")
    spread = rounds_spread(stats)
    if spread is not None:
        text += (f"The same configuration measured twice differed by up to {100 * spread[0]:.1f}% "
                 f"({untrusted(spread[1])}): a difference between two parts smaller than that is noise. ")
    if max(steps, default=0) < COURSE_STEPS:
        text += (f"For the course's count run `sudo ddptop lab --profile cs744-lab-course --headless --record-dir "
                 f"runs/cs744-lab-course` ({COURSE_STEPS} measured steps per part, one round; about 11 min here).")
    return text
