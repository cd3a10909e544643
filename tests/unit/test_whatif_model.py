"""The what-if model's two mechanisms against answers worked by hand: the overlap timeline (layers and buckets
sharing a CPU) and the α–β fit (samples generated from a known α and β, with the wire formulas' bytes)."""

from __future__ import annotations

import pytest

from ddptop.metrics.whatif.data import CommSample
from ddptop.metrics.whatif.link import fit_line
from ddptop.metrics.whatif.simulate import overlapped


def test_a_bucket_beside_the_last_layer_slows_both_as_the_factors_say():
    # layer 0 (1 s), then layer 1 (1 s) beside bucket 0 (1 s of work, ready after layer 0)
    alone = overlapped([1.0, 1.0], [0], [1.0], 0.0, 0.0)
    assert (alone.bwd_s, alone.exposed_s, alone.overlap) == pytest.approx((2.0, 0.0, 1.0))
    # compute at half speed beside it: the bucket ends at 2 s, layer 1 did 0.5 s of work by then, the rest by 2.5 s
    slowed = overlapped([1.0, 1.0], [0], [1.0], 1.0, 0.0)
    assert (slowed.bwd_s, slowed.comm_s, slowed.exposed_s, slowed.overlap) == pytest.approx((2.5, 1.0, 0.0, 1.0))
    # both at half speed: each does 1 s of work in 2 s, together, ending at 3 s
    both = overlapped([1.0, 1.0], [0], [1.0], 1.0, 1.0)
    assert (both.bwd_s, both.comm_s, both.exposed_s) == pytest.approx((3.0, 2.0, 0.0))


def test_buckets_run_one_after_another_and_the_last_is_exposed():
    # 3 layers of 1 s; bucket 0 (1.5 s) ready after layer 0, bucket 1 (0.5 s) after layer 2; no slowdown
    t = overlapped([1.0, 1.0, 1.0], [0, 2], [1.5, 0.5], 0.0, 0.0)
    # bucket 0 runs 1.0-2.5, bucket 1 waits for layer 2 (ends at 3.0), runs 3.0-3.5: 0.5 s exposed
    assert (t.bwd_s, t.comm_s, t.exposed_s) == pytest.approx((3.0, 2.0, 0.5))
    assert t.overlap == pytest.approx(1.5 / 2.0)


def test_the_fit_recovers_alpha_and_beta_from_a_ring_and_a_root():
    alpha, beta, world = 0.5e-3, 8e-9, 4  # 0.5 ms a latency step, 1 Gbit/s
    ring = [CommSample("allreduce", n, alpha * 2 * (world - 1) + beta * 2 * (world - 1) / world * n)
            for n in (1_000, 100_000, 1_000_000, 10_000_000)]
    line = fit_line("allreduce", ring, world)
    assert (line.alpha, line.beta, line.residual) == pytest.approx((alpha, beta, 0.0), abs=1e-12, rel=1e-6)
    gather = [CommSample("gather", n, alpha * (world - 1) + beta * (world - 1) * n) for n in (10_000, 5_000_000)]
    line = fit_line("gather", gather, world)
    assert (line.alpha, line.beta) == pytest.approx((alpha, beta), rel=1e-6)
    # a sample the backward pass ran beside for half its time, at a slowdown of 1: its time alone is 3/4 of it
    slowed = [CommSample("allreduce", s.nbytes, s.dur_s * 4 / 3, s.dur_s * 2 / 3) for s in ring]
    assert fit_line("allreduce", slowed, world, slowdown=1.0).beta == pytest.approx(beta, rel=1e-6)


def test_a_timeline_with_an_infinite_time_is_refused_not_looped_forever():
    """A damaged recording's inf (a layer's backward time) made the simulation loop forever (inf − inf = nan)."""
    import math

    import pytest

    from ddptop.metrics.whatif.simulate import overlapped

    with pytest.raises(ValueError):
        overlapped([0.1, math.inf], [0], [0.2], 0.6, 0.2)


def test_a_tie_names_the_configuration_in_force_not_the_first_row():
    """A model smaller than every bucket (tiny's 84 KB) is predicted alike at 1 and 25 MB: the best is then the
    configuration in force (the recording's DDP 25 MB segment), not the table's first row (DDP 1 MB)."""
    from ddptop.record.reader import Recording
    from ddptop.record.whatif import best
    from ddptop.state.advising import describe
    from labs import REPO

    with Recording.open(str(REPO / "recordings" / "live-switch.db")) as rec:
        top = best(rec, 0)
    assert (top["strategy"], top["bucket_mb"]) == ("ddp", 25.0) and top["saving_s"] == pytest.approx(0.0, abs=1e-6)
    assert describe(top) == "ddp 25 MB, the configuration in force, is fastest"
    # the fitted row's saving is the calibration's rounding, either sign: on a live tiny job the screen said
    # "best: ddp 25 MB, −0 ms/step (0%) predicted" for a saving of a few µs
    assert describe({**top, "saving_s": 3e-6}) == "ddp 25 MB, the configuration in force, is fastest"


def test_advise_says_the_configuration_in_force_is_best_when_nothing_beats_it():
    import subprocess
    import sys

    from labs import REPO

    out = subprocess.run([sys.executable, "-m", "ddptop", "advise", str(REPO / "recordings" / "live-switch.db")],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[-1] == "best at 2 ranks: ddp 25 MB, the configuration in force: no other is " \
                                          "faster (measured where the recording ran it, else predicted)"


def test_the_comm_slowdown_is_fitted_only_where_buckets_ran_both_beside_the_backward_pass_and_alone():
    """link.fit_comm_slowdown: buckets of 10 MB at 3 ranks, 2 ns a wire byte alone, 3× as long beside (s = 2)."""
    from ddptop.metrics.whatif.link import DEFAULT_ALPHA, fit_comm_slowdown, latency_steps, wire_bytes

    def bucket(nbytes: int, beside: bool) -> CommSample:
        t = DEFAULT_ALPHA * latency_steps("allreduce", 3) + 2e-9 * wire_bytes("allreduce", nbytes, 3) * (1 + 2 * beside)
        return CommSample("allreduce", nbytes, t, t if beside else 0.0)

    both = [bucket(10_000_000, True), bucket(6_000_000, True), bucket(8_000_000, False), bucket(4_000_000, False)]
    assert fit_comm_slowdown(both, 3) == pytest.approx(2.0, rel=1e-6)
    assert fit_comm_slowdown(both[:3], 3) is None  # one alone: MIN_EACH is 2
    assert fit_comm_slowdown([b for b in both if b.overlap_s == 0] * 2, 3) is None  # none beside
    assert fit_comm_slowdown(both, 1) is None
