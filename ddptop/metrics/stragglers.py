"""Stragglers: which rank arrives last at the collectives and by how much, on clocks aligned to rank 0's.

DDP's backward ends when the last bucket is reduced, so every rank's phases stretch alike (a 200 ms delay on one of
four ranks showed as ~293 ms of backward on all four, traceml#252): phase durations cannot name a straggler. Its
arrivals can. Each comm span starts as its rank calls the collective (probes.comm.arrive); a rank's span times are
its wall clock (StepSpans.t0) plus the span's start, and ClockSync's ping-pong gives each rank's offset to rank 0
(and its drift between the run's start and end), true within ±rtt/2. Per collective, on rank 0's clock:
  waiting    the last rank's arrival − this rank's arrival: time spent only waiting for the others
  transfer   the last arriving rank's own span: from the moment every rank was there to its completion
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Iterable, Iterator, Mapping

from ddptop.events import ClockSync, StepSpans

# The rule that names a straggler. A rank is named when it arrived last at ≥ SHARE of the collectives that every
# rank recorded (with 3 ranks chance makes any one last at 1/3, with 2 at 1/2), at least MIN_COLLECTIVES of them
# from MIN_STEPS sampled steps, and at more than half of those (its median) by a lead over the next-to-last arrival
# above NOISE_S plus the two clocks' uncertainty (±rtt/2 of each). NOISE_S: on this 2-core machine, healthy 3-rank
# tiny runs lead by a median 0.3-0.9 ms (90th percentile 1.6-5.8 ms at a load average of 20+; README: Stragglers), a
# scheduler's time slice (CFS: 0.75-3 ms) being the jitter one runnable rank waits for; a median over 2 ms keeps that
# noise unnamed and names a straggler tens of ms late.
#
# The steps, not the collectives, are the pieces of evidence: a step's collectives share its backward pass (its 34
# async all-reduces are one piece), so one slow backward makes a rank last at all of them. A sampled step votes for
# the rank last at most of its collectives (a tie: no vote), and the candidate is named only when its votes are
# beyond chance: with N ranks each is last in a step with probability 1/N, and the chance of at least its votes in
# that many steps must be ≤ CHANCE. On 2 local ranks of VGG-11 (2 cores, nothing else running) rank 1 was last at 6
# of 8 collectives, 32 ms ahead on average, and was named; it was last in 2 of the 4 sampled steps (the other 2
# split), which chance gives 69% of the time. With 2 ranks 5 steps of 5 are needed, 7 of 8, 9 of 10; with 3, 3 of 3.
SHARE = 2 / 3
MIN_COLLECTIVES = 8  # the shipped lab reports' DDP segments, 2 sampled steps of 2-3 buckets, named a rank at 4-6
MIN_STEPS = 3  # fewer cannot be beyond chance at 2 or 3 ranks (CHANCE below)
CHANCE = 0.05
NOISE_S = 0.002


def chance(votes: int, steps: int, ranks: int) -> float:
    """The probability that one given rank of `ranks` is last in at least `votes` of `steps` steps by chance."""
    p = 1 / ranks
    return sum(math.comb(steps, k) * p ** k * (1 - p) ** (steps - k) for k in range(votes, steps + 1))


@dataclass(frozen=True)
class RankClock:
    """One rank's wall clock minus rank 0's: offset_s at t_ref (rank 0's time), drifting by drift_s per second."""

    offset_s: float = 0.0
    uncertainty_s: float = 0.0  # ± the larger of the start's and the end's rtt/2
    drift: float = 0.0
    t_ref: float = 0.0

    def to_rank0(self, t: float) -> float:
        """A time read on this rank's clock, on rank 0's."""
        offset = self.offset_s + self.drift * (t - self.offset_s - self.t_ref)
        return t - offset


def clocks(syncs: Iterable[ClockSync]) -> dict[int, RankClock]:
    """Each rank's clock from the run's first `start` and last `end` ping-pong (drift needs both; one alone gives
    a constant offset). Ranks never measured are absent: their spans are taken as on rank 0's clock."""
    start = end = None
    for s in syncs:
        if s.at == "start" and start is None:
            start = s
        elif s.at == "end":
            end = s
    first = start or end
    if first is None:
        return {}
    out = {}
    later = {rank: (offset, rtt) for rank, offset, rtt in (end.peers if end is not None and end is not first else ())}
    for rank, offset, rtt in first.peers:
        uncertainty, drift = abs(rtt) / 2, 0.0
        if rank in later and end.t > first.t:
            offset_end, rtt_end = later[rank]
            drift = (offset_end - offset) / (end.t - first.t)
            drift = drift if math.isfinite(drift) else 0.0  # ends a hair apart in a file someone wrote
            uncertainty = max(uncertainty, abs(rtt_end) / 2)
        out[rank] = RankClock(offset, uncertainty, drift, first.t)
    return out


@dataclass(frozen=True)
class Collective:
    """One collective of one step as every rank met it, times on rank 0's clock."""

    segment: int
    step: int
    name: str
    arrivals: dict[int, float]  # rank → arrival
    transfer_s: float  # the last arriving rank's own span duration

    @property
    def last(self) -> int:
        return max(self.arrivals, key=lambda r: (self.arrivals[r], r))

    @property
    def lead_s(self) -> float:
        """How long the last rank kept the others waiting: its arrival − the next-to-last one's (with 2 ranks, the
        first's). The first arrival would add its own earliness: under load one rank's backward ends tens of ms
        before the others', and that is no straggler's doing."""
        first_to_last = sorted(self.arrivals.values())
        return first_to_last[-1] - first_to_last[-2]

    def waiting_s(self, rank: int) -> float:
        return max(self.arrivals.values()) - self.arrivals[rank]


def collectives(spans: Iterable[StepSpans], world_size: int,
                rank_clocks: dict[int, RankClock]) -> Iterator[Collective]:
    """Every (segment, step, collective name) that all `world_size` ranks recorded, as soon as the last one's
    spans arrive (streamed: a long recording's spans are never all held at once)."""
    open_: dict[tuple[int, int, str], dict[int, tuple[float, float]]] = {}
    for event in spans:
        clock = rank_clocks.get(event.rank, RankClock())
        for s in event.spans:
            if s.kind != "comm":
                continue
            key = (event.segment, event.step, s.name)
            by_rank = open_.setdefault(key, {})
            by_rank.setdefault(event.rank, (clock.to_rank0(event.t0 + s.start_s), s.dur_s))
            if len(by_rank) == world_size:
                del open_[key]
                arrivals = {rank: a for rank, (a, _) in by_rank.items()}
                last = max(arrivals, key=lambda r: (arrivals[r], r))
                yield Collective(event.segment, event.step, name=s.name, arrivals=arrivals,
                                 transfer_s=by_rank[last][1])
    # what is left open some rank never reported (its telemetry lost): it compares nothing


@dataclass(frozen=True)
class Stragglers:
    """The verdict over some collectives: `rank` is None when none is consistently last by a margin."""

    collectives: int = 0
    steps: int = 0  # sampled steps they came from
    rank: int | None = None
    candidate: int | None = None  # the rank most often last, named or not
    share: float = 0.0  # of the collectives the candidate arrived last at
    late_s: float = 0.0  # mean lead of the candidate over the next-to-last arrival where it was last
    clear: bool = False  # its median lead is over the margin (more than half of those leads are)
    transfer_s: float = 0.0  # mean over all collectives
    waiting_s: dict[int, float] = field(default_factory=dict)  # mean per rank
    margin_s: float = NOISE_S
    uncertainty_s: float = 0.0  # the largest ±rtt/2 of any rank's clock
    aligned: bool = True  # False: no ping-pong recorded (older recordings), the ranks' clocks taken as one
    votes: int = 0  # sampled steps whose collectives the candidate was last at most of
    chance: float = 1.0  # the probability of at least that many by chance (CHANCE: the bound to be named)
    ranks: int = 0
    one_host: bool = False  # every rank ran on one host (its hosts as the ranks said them at their join)

    def describe(self) -> str:
        """One line for info, the report and the screen."""
        if not self.collectives:
            return "no collective recorded by every rank (spans are sampled with --probes all on several ranks)"
        clock = (f"clocks aligned ±{_ms(self.uncertainty_s)}" if self.aligned
                 else "clocks not aligned: no ping-pong recorded")
        if self.rank is None:
            if self.collectives < MIN_COLLECTIVES or self.steps < MIN_STEPS:
                why = (f"{self.collectives} collectives from {self.steps} sampled steps recorded by every rank "
                       f"({MIN_COLLECTIVES} from {MIN_STEPS} needed)")
            elif self.share < SHARE:
                why = (f"no rank arrived last at ≥{SHARE:.0%} of {self.collectives} collectives (rank "
                       f"{self.candidate} most often, {self.share:.0%})")
            elif self.chance > CHANCE:
                why = (f"rank {self.candidate} arrived last at {self.share:.0%} of {self.collectives} collectives, "
                       f"{_ms(self.late_s)} after the rest on average, but was last in {self.votes} of {self.steps} "
                       f"sampled steps, which chance gives one of {self.ranks} ranks {self.chance:.0%} of the time")
            else:
                why = (f"rank {self.candidate} arrived last at {self.share:.0%} of {self.collectives} collectives, "
                       f"{_ms(self.late_s)} after the rest on average, but mostly within the {_ms(self.margin_s)} "
                       "of noise and clocks")
            return f"no straggler: {why}; transfer {_ms(self.transfer_s)} ({clock})"
        shared = "; all ranks share one host: contention there (CPU, the screen) can make a rank late" \
            if self.one_host else ""
        return (f"rank {self.rank} arrived last at {self.share:.0%} of {self.collectives} collectives, "
                f"{_ms(self.late_s)} after the rest on average; transfer {_ms(self.transfer_s)} ({clock}){shared}")


class Tally:
    """Running sums toward one verdict (constant memory per rank)."""

    def __init__(self, rank_clocks: dict[int, RankClock], world_size: int):
        self.clocks = rank_clocks
        self.world_size = world_size
        self.uncertainty = max((c.uncertainty_s for c in rank_clocks.values()), default=0.0)
        self.n = 0
        self.steps: dict[tuple[int, int], dict[int, int]] = {}  # sampled step → rank → collectives it was last at
        self.transfer = 0.0
        self.last: dict[int, int] = {}
        self.lead: dict[int, float] = {}
        self.clear: dict[int, int] = {}  # collectives where the rank was last by more than its margin
        self.waiting: dict[int, float] = {}

    def margin(self, rank: int) -> float:
        # a lead compares two clocks: each is off by up to its own ±rtt/2
        return NOISE_S + self.clocks.get(rank, RankClock()).uncertainty_s + self.uncertainty

    def add(self, c: Collective) -> None:
        last, lead = c.last, c.lead_s
        self.n += 1
        in_step = self.steps.setdefault((c.segment, c.step), {})
        in_step[last] = in_step.get(last, 0) + 1
        self.transfer += c.transfer_s
        self.last[last] = self.last.get(last, 0) + 1
        self.lead[last] = self.lead.get(last, 0.0) + lead
        self.clear[last] = self.clear.get(last, 0) + (lead > self.margin(last))
        for rank in c.arrivals:
            self.waiting[rank] = self.waiting.get(rank, 0.0) + c.waiting_s(rank)

    def verdict(self) -> Stragglers:
        """The rule at the top: most often last at ≥ SHARE of ≥ MIN_COLLECTIVES collectives, and at more than half
        of those (its median lead) by more than the margin."""
        if not self.n:
            return Stragglers()
        candidate = max(self.last, key=lambda r: (self.last[r], -r))
        count = self.last[candidate]
        share = count / self.n
        clear = self.clear[candidate] > count / 2
        votes = sum(1 for lasts in self.steps.values()
                    if lasts.get(candidate, 0) > max((n for r, n in lasts.items() if r != candidate), default=0))
        beyond = chance(votes, len(self.steps), self.world_size)
        named = (self.n >= MIN_COLLECTIVES and len(self.steps) >= MIN_STEPS and share >= SHARE and clear
                 and beyond <= CHANCE)
        return Stragglers(self.n, len(self.steps), candidate if named else None, candidate, share,
                          self.lead[candidate] / count,
                          clear, self.transfer / self.n, {r: w / self.n for r, w in sorted(self.waiting.items())},
                          self.margin(candidate), self.uncertainty, bool(self.clocks), votes, beyond,
                          self.world_size)


def analyse(spans: Iterable[StepSpans], syncs: Iterable[ClockSync], world_size: int,
            hosts: Mapping[int, str] | None = None) -> dict[int | None, Stragglers]:
    """The verdict for the whole run (key None) and for each segment. `hosts`: rank → host, where known: a rank
    named on a single host gets a caution, that contention there can make a rank late (2 local ranks under the
    screen on 2 cores named rank 0 with nothing injected: a real lead, the shared machine's doing)."""
    known = {r: h for r, h in (hosts or {}).items() if h and h != "?"}
    one_host = len(known) >= world_size and len(set(known.values())) == 1
    rank_clocks = clocks(syncs)
    tallies: dict[int | None, Tally] = {None: Tally(rank_clocks, world_size)}
    if world_size < 2:
        return {None: Stragglers()}
    for c in collectives(spans, world_size, rank_clocks):
        tallies[None].add(c)
        if c.segment not in tallies:
            tallies[c.segment] = Tally(rank_clocks, world_size)
        tallies[c.segment].add(c)
    return {key: replace(tally.verdict(), one_host=one_host)
            for key, tally in sorted(tallies.items(), key=lambda kv: -1 if kv[0] is None else kv[0])}


def _ms(seconds: float) -> str:
    ms = seconds * 1000
    return f"{ms:.1f} ms" if ms >= 0.95 else f"{ms:.2f} ms"
