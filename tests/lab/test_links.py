"""The lab's links and CPU quotas measured from inside it: a TCP transfer between two hosts gets the shaped
rate (±10%) each way, and a busy process on a host gets its CPU quota (±15%).

The shaper and the quota are caps, so no attempt may exceed them; reaching them needs CPU that other jobs on
this shared 2-core machine may hold for a while, so each measurement gets up to 4 attempts to reach them."""

from __future__ import annotations

import pytest

from ddptop.lab import check, netns
from ddptop.lab.cluster import Lab
from ddptop.lab.links import parse_link
from labs import LAB_REFUSED, NETNS_REFUSED

ATTEMPTS = 4


@pytest.mark.skipif(bool(NETNS_REFUSED), reason=NETNS_REFUSED or "namespaces work")
# rates at which TCP both ways leaves CPU to spare: from ~300 Mbit/s each way a loaded machine, not the shaper,
# is the limit (267 Mbit/s at 300mbit, 853 at 1gbit while other suites ran); README's --check table has the
# higher rates, and tests/lab/test_truth.py checks ddptop against a 1 Gbit/s link
@pytest.mark.parametrize("rate", ["50mbit", "100mbit"])
def test_a_transfer_between_two_hosts_gets_the_shaped_rate_each_way(rate, tmp_path, monkeypatch):
    monkeypatch.setenv("DDPTOP_LAB_DIR", str(tmp_path))
    bits = parse_link(rate).bits_per_s
    with Lab(2, parse_link(rate), cpus=None) as lab:
        assert "tbf" in netns.qdiscs(lab.names[0], "eth0") and "tbf" in netns.qdiscs(lab.switch, lab.port(0))
        for pairs in ([(1, 0)], [(0, 1), (1, 0)]):  # one way, then both at once (full duplex)
            for _ in range(ATTEMPTS):
                flows = check.measure_flows(lab, pairs, seconds=2.0)
                for flow in flows:
                    print(f"{rate}: {flow.src}→{flow.dst} {flow.wire_bps / 1e6:.0f} Mbit/s on the receiver's eth0, "
                          f"{flow.goodput_bps / 1e6:.0f} Mbit/s TCP payload")
                assert all(flow.wire_bps <= 1.10 * bits for flow in flows), flows
                if all(flow.wire_bps >= 0.90 * bits for flow in flows):
                    break
            else:
                pytest.fail(f"{pairs} never reached 90% of {rate} in {ATTEMPTS} attempts: {flows}")


@pytest.mark.skipif(bool(LAB_REFUSED), reason=LAB_REFUSED or "labs work")
def test_a_busy_process_gets_its_hosts_cpu_quota(tmp_path, monkeypatch):
    monkeypatch.setenv("DDPTOP_LAB_DIR", str(tmp_path))
    best = [0.0, 0.0]
    with Lab(2, parse_link("unlimited"), cpus=0.3) as lab:
        for _ in range(ATTEMPTS):
            got = check.measure_cpu(lab, [0, 1], seconds=1.5)
            print("CPU a busy loop got on each host (quota 0.3):", got)
            assert all(share <= 0.3 * 1.15 for share in got), got
            best = [max(b, g) for b, g in zip(best, got)]
            if all(b >= 0.3 * 0.85 for b in best):
                break
    assert all(b >= 0.3 * 0.85 for b in best), best
