"""Several hosts on one machine (network namespaces): real traffic on each host's own eth0, counted right."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ddptop.events import StepDone, SystemSample, event_from_dict
from ddptop.probes import wire
from ddptop.traffic import measured_vs_expected
from netns_cluster import Cluster, namespaces_work

REASON = namespaces_work()
pytestmark = pytest.mark.skipif(bool(REASON), reason=REASON or "namespaces work")
TESTS = Path(__file__).resolve().parents[1]
RUN = ["--headless", "--no-eval", "--threads", "1", "--log-every", "50", "--port", "29511", "--timeout", "60", "--backend",
       "gloo"]
# tiny's 12 tensors fill one DDP bucket of 84 KB; per-parameter collectives need VGG-11's big tensors, since
# per-message TCP/IP overhead would swamp tiny's 64-byte biases
MODELS = {"tiny": (20986 * 4, ["--model", "tiny", "--synthetic-size", "1920", "--batch-size", "16", "--steps", "150"]),
          "vgg11": (9231114 * 4, ["--model", "vgg11", "--synthetic-size", "480", "--batch-size", "2", "--steps", "16"])}


def run_cluster(hosts: int, strategy: str, model: str, tmp_path: Path) -> list:
    out = tmp_path / "events.jsonl"
    env = {**os.environ, "PYTHONPATH": str(TESTS.parent)}
    with Cluster(hosts) as cluster:
        flags = ["--master", cluster.addresses[0], "--world-size", str(hosts), "--strategy", strategy, *RUN,
                 *MODELS[model][1]]
        front = cluster.popen(0, [sys.executable, str(TESTS / "netns_front.py"), str(out), "--", "--rank", "0",
                                  *flags], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        workers = [cluster.popen(i, [sys.executable, "-m", "ddptop", "--rank", str(i), *flags], env=env,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                   for i in range(1, hosts)]
        try:
            results = [p.communicate(timeout=180) for p in [front, *workers]]
        finally:
            for p in [front, *workers]:
                if p.poll() is None:
                    p.kill()
    assert [p.returncode for p in [front, *workers]] == [0] * hosts, results
    return [event_from_dict(json.loads(line)) for line in out.read_text().splitlines()]


def traffic_of(events: list, rank: int):
    traffic = measured_vs_expected([e for e in events if isinstance(e, SystemSample) and e.rank == rank],
                                   [e for e in events if isinstance(e, StepDone) and e.rank == rank])
    assert traffic is not None and traffic.steps >= 3, "the run was too short to sample the NIC during training"
    print(traffic.describe())
    return traffic


@pytest.mark.parametrize("hosts,strategy,model", [(2, "ddp", "tiny"), (3, "allreduce", "vgg11"),
                                                  (3, "gather-scatter", "vgg11")])
def test_each_host_counts_its_own_traffic_and_it_matches_the_formulas(hosts, strategy, model, tmp_path):
    events = run_cluster(hosts, strategy, model, tmp_path)
    param_bytes, flags = MODELS[model]
    steps = int(flags[-1])
    samples = [e for e in events if isinstance(e, SystemSample)]
    assert {s.rank for s in samples} == set(range(hosts))
    assert all(s.job_iface == "eth0" for s in samples)  # the interface that routes to the master, not lo
    for rank in range(hosts):
        done = [e for e in events if isinstance(e, StepDone) and e.rank == rank]
        assert len(done) == steps
        if strategy == "gather-scatter":  # rank 0: (N-1)S in and out; the others S each way
            expected = 2 * (hosts - 1) * param_bytes if rank == 0 else 2 * param_bytes
            assert done[-1].tx_bytes + done[-1].rx_bytes == expected
        else:
            assert abs(done[-1].tx_bytes - wire.ring_allreduce(param_bytes, hosts)[0]) <= 40
        traffic = traffic_of(events, rank)
        assert traffic.expected_tx > 0 and abs(traffic.tx_error) <= 0.2, traffic
