"""Interval arithmetic over a step's spans: compute, communication, exposed communication and overlap."""

from __future__ import annotations

from typing import Iterable

Interval = tuple[float, float]

COMPUTE_KINDS = ("fwd", "bwd", "opt")


def union(intervals: Iterable[Interval]) -> list[Interval]:
    merged: list[list[float]] = []
    for start, end in sorted(i for i in intervals if i[1] > i[0]):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(a, b) for a, b in merged]


def length(intervals: Iterable[Interval]) -> float:
    return sum(b - a for a, b in union(intervals))


def intersection(a: Iterable[Interval], b: Iterable[Interval]) -> list[Interval]:
    ua, ub = union(a), union(b)
    out, i, j = [], 0, 0
    while i < len(ua) and j < len(ub):
        start, end = max(ua[i][0], ub[j][0]), min(ua[i][1], ub[j][1])
        if end > start:
            out.append((start, end))
        if ua[i][1] < ub[j][1]:
            i += 1
        else:
            j += 1
    return out


def difference(a: Iterable[Interval], b: Iterable[Interval]) -> list[Interval]:
    """The parts of `a` outside every interval of `b`."""
    out = []
    cuts = union(b)
    for start, end in union(a):
        for cut_start, cut_end in cuts:
            if cut_end <= start or cut_start >= end:
                continue
            if cut_start > start:
                out.append((start, cut_start))
            start = max(start, cut_end)
        if end > start:
            out.append((start, end))
    return out


def breakdown(compute: list[Interval], comm: list[Interval],
              blocking: Iterable[Interval] = ()) -> tuple[float, float, float, float]:
    """(compute_s, comm_s, exposed_comm_s, overlap).

    overlap follows HTA: time computing while communicating / time communicating (0 when nothing is sent).
    Exposed communication is communication time with no compute running beside it. `blocking`: collectives that
    stopped the computing thread itself (FSDP2's all-gathers inside a forward phase on a CPU): no compute runs
    beside them, however the phases around them are drawn, so they are cut out of `compute` first.
    """
    blocking = union(blocking)
    if blocking:
        compute = difference(compute, blocking)
    compute_s = length(compute)
    comm_s = length(comm)
    hidden = length(intersection(compute, comm))
    overlap = hidden / comm_s if comm_s > 0 else 0.0
    return compute_s, comm_s, comm_s - hidden, overlap


def span_overlap(spans: Iterable) -> tuple[list[Interval], float]:
    """A sampled step's overlap as its spans draw it: (the intervals where communication ran while a layer's
    forward or backward or the optimizer ran, that time over the communication's). The timeline's overlap lane and
    the share in its header, one definition (issue 44: "overlap 93%" above an empty lane). Finer than the step's
    own overlap (StepDone.overlap), which counts the whole backward phase as compute: on a CPU under gloo the
    backward thread stops between layers while a DDP bucket is reduced (live-switch.db, rank 0, step 1072: bucket 0
    ran 2.8 ms between two layers' backward, drawn with no layer beside it), and a module with parameters of its
    own but no leaf-layer hook leaves a gap too. Waiting on an async handle is not communication."""
    spans = list(spans)
    compute = [(s.start_s, s.end_s) for s in spans if s.kind in COMPUTE_KINDS]
    comm = [(s.start_s, s.end_s) for s in spans if s.kind == "comm"]
    return intersection(compute, comm), breakdown(compute, comm)[3]
