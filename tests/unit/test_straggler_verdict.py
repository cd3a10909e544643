"""The straggler verdict (metrics.stragglers) on spans whose arrivals are known by construction: the clocks'
offset and drift taken out, the rule's share and margin, collectives some rank never reported."""

from __future__ import annotations

import pytest

from ddptop.events import ClockSync, Span, StepSpans
from ddptop.metrics.stragglers import NOISE_S, analyse, clocks

T0 = 1.7e9
US = 1e-6  # times near 1.7e9 s round to 0.24 µs


def steps(late: dict[int, float], n_steps: int = 4, names=("allreduce a", "allreduce b", "allreduce c"),
          offsets: dict[int, float] | None = None, ranks=(0, 1, 2), drift: float = 0.0) -> list[StepSpans]:
    """Each step 1 s apart; collective k is called at 0.1 + 0.05 k s into the step (rank 0's clock), `late[r]`
    seconds later by rank r; rank r's clock reads offsets[r] + drift·(t − T0) ahead of rank 0's."""
    out = []
    for step in range(n_steps):
        for rank in ranks:
            true_t0 = T0 + step
            skew = (offsets or {}).get(rank, 0.0) + drift * step * (rank == 2)
            spans = tuple(Span("comm", name, 0.1 + 0.05 * k + late.get(rank, 0.0), 0.003, 64)
                          for k, name in enumerate(names))
            out.append(StepSpans(rank, step, 0, true_t0 + skew, (Span("bwd", "backward", 0.0, 0.1),) + spans))
    return out


def sync(at: str, t: float, offsets: dict[int, float], rtt: float = 2e-4) -> ClockSync:
    return ClockSync(0, at, t, tuple((r, o, 0.0 if r == 0 else rtt) for r, o in sorted(offsets.items())))


def test_a_rank_late_at_every_collective_is_named_with_its_lead():
    verdict = analyse(steps({2: 0.030}), [], 3)[None]
    assert verdict.rank == 2 and verdict.share == 1.0 and verdict.collectives == 12
    assert verdict.late_s == pytest.approx(0.030, abs=US)
    assert verdict.waiting_s == pytest.approx({0: 0.030, 1: 0.030, 2: 0.0}, abs=US)
    assert verdict.transfer_s == pytest.approx(0.003, abs=US)
    assert verdict.describe().startswith("rank 2 arrived last at 100% of 12 collectives, 30.0 ms after the rest")


def test_the_lead_is_over_the_next_to_last_arrival_not_the_first():
    """Rank 0 early by 50 ms is no one's straggling: rank 2 kept the others waiting 10 ms."""
    verdict = analyse(steps({0: -0.050, 2: 0.010}), [], 3)[None]
    assert verdict.rank == 2 and verdict.late_s == pytest.approx(0.010, abs=US)


def test_nothing_is_named_within_the_noise_margin_or_below_the_share():
    small = analyse(steps({2: NOISE_S / 2}), [], 3)[None]
    assert small.rank is None and small.candidate == 2 and "within the 2.0 ms of noise and clocks" in small.describe()
    # last at half of the collectives: rank 1 in steps 0-1, rank 2 in steps 2-3
    half = analyse(steps({1: 0.030}, 2) + [StepSpans(e.rank, e.step + 2, 0, e.t0 + 2, e.spans)
                                           for e in steps({2: 0.030}, 2)], [], 3)[None]
    assert half.rank is None and half.share == 0.5 and "no rank arrived last at ≥67%" in half.describe()
    assert analyse(steps({2: 0.030}, n_steps=1), [], 3)[None].rank is None  # 3 collectives: too few to tell
    # 12 collectives, but from 2 steps: a step's collectives share its backward pass, 2 pieces of evidence
    two = analyse(steps({2: 0.030}, n_steps=2, names=[f"allreduce {k}" for k in range(6)]), [], 3)[None]
    assert two.rank is None and two.collectives == 12 and "from 2 sampled steps" in two.describe()


def test_the_clock_offset_and_its_drift_are_taken_out():
    """Rank 2's clock is 5 s ahead at the start and 5.003 s at the end (3 ms over 3 s): without the ping-pong it
    would seem 5 s late; with it, rank 1 (20 ms late) is named with its own lead."""
    spans = steps({1: 0.020}, offsets={2: 5.0}, drift=0.001)
    syncs = [sync("start", T0, {0: 0.0, 1: 0.0, 2: 5.0}), sync("end", T0 + 3, {0: 0.0, 1: 0.0, 2: 5.003})]
    assert clocks(syncs)[2].drift == pytest.approx(0.001)
    aligned = analyse(spans, syncs, 3)[None]
    assert aligned.rank == 1 and aligned.late_s == pytest.approx(0.020, abs=US)
    assert aligned.uncertainty_s == pytest.approx(1e-4)
    assert analyse(spans, [], 3)[None].rank == 2


def test_a_collective_some_rank_never_reported_compares_nothing():
    spans = [e for e in steps({2: 0.030}) if not (e.rank == 1 and e.step == 3)]
    verdicts = analyse(spans, [], 3)
    assert verdicts[None].collectives == 9 and verdicts[0].rank == 2
    assert analyse(spans, [], 1) == {None: analyse([], [], 1)[None]}  # one rank: nothing to compare


def test_the_overview_names_a_straggler_of_the_segment_in_force_and_nothing_else():
    from ddptop.events import RunStarted
    from ddptop.state.session import SessionState
    from ddptop.tui.render.overview import warnings

    state = SessionState()
    state.apply(RunStarted("tiny", "synthetic", 3, "allreduce", 25.0, False, 16, 0.1, 250, 1000, 4, (), 20, T0))
    state.apply_all(steps({0: 0.001, 1: 0.002}))  # ~noise: nothing to say
    assert state.snapshot().straggler == "" and warnings(state.snapshot()) == []
    state.apply_all(steps({2: 0.030}))  # the same steps again, rank 2 now 30 ms late
    shown = " ".join(t.plain for t in warnings(state.snapshot()))
    assert shown.startswith("straggler: rank 2 arrived last at 100% of 12 collectives, 30.0 ms after the rest")


def _two_ranks(late_by_step: list[dict[str, int]], lead: float = 0.030) -> list[StepSpans]:
    """2 ranks; in step i, collective name → the rank that arrives `lead` late (the other on time)."""
    out = []
    for step, lasts in enumerate(late_by_step):
        for rank in (0, 1):
            spans = tuple(Span("comm", name, 0.1 + 0.05 * k + (lead if lasts[name] == rank else 0.0), 0.003, 64)
                          for k, name in enumerate(sorted(lasts)))
            out.append(StepSpans(rank, step, 0, T0 + step, (Span("bwd", "backward", 0.0, 0.1),) + spans))
    return out


def test_a_rank_last_at_most_collectives_but_in_few_steps_is_within_chance():
    """2 local VGG-11 ranks, nothing injected: rank 1 last at 6 of 8 collectives, 32 ms ahead on average, but last
    in 2 of 4 sampled steps (the other 2 split): chance gives that 69% of the time, so it is not named."""
    split = {"bucket 0": 1, "bucket 1": 0}
    verdict = analyse(_two_ranks([split, {"bucket 0": 1, "bucket 1": 1}, {"bucket 0": 1, "bucket 1": 1},
                                  {"bucket 0": 0, "bucket 1": 1}]), [], 2)[None]
    assert verdict.share == 0.75 and verdict.candidate == 1 and verdict.clear and verdict.votes == 2
    assert verdict.rank is None and verdict.chance == pytest.approx(11 / 16)
    assert "but was last in 2 of 4 sampled steps, which chance gives one of 2 ranks 69% of the time" in \
        verdict.describe()


@pytest.mark.parametrize("steps_last, named", [(4, False), (5, True), (7, True)])
def test_with_two_ranks_a_straggler_needs_steps_beyond_chance(steps_last, named):
    """Last in every one of 4 steps is 1/16 = 6% by chance (over the 5% bound); 5 of 5 is 3%; 7 of 8 is 3.5%."""
    always = {"bucket 0": 1, "bucket 1": 1, "bucket 2": 1}
    other = [{"bucket 0": 0, "bucket 1": 0, "bucket 2": 0}] if steps_last == 7 else []
    verdict = analyse(_two_ranks([always] * steps_last + other), [], 2)[None]
    assert verdict.votes == steps_last and (verdict.rank == 1) is named, verdict.describe()


def test_a_straggler_on_a_host_every_rank_shares_gets_the_caution_that_contention_there_can_make_a_rank_late():
    one = analyse(steps({2: 0.030}), [], 3, {0: "vm", 1: "vm", 2: "vm"})[None]
    assert one.rank == 2 and one.one_host
    assert one.describe().endswith("; all ranks share one host: contention there (CPU, the screen) can make a rank "
                                   "late")
    for hosts in ({0: "a", 1: "a", 2: "b"}, {0: "vm", 1: "vm"}, {0: "?", 1: "?", 2: "?"}, None):  # two hosts; a
        # rank's host unknown (not joined yet, "?" on the screen): not said
        other = analyse(steps({2: 0.030}), [], 3, hosts)[None]
        assert other.rank == 2 and not other.one_host and "one host" not in other.describe()
