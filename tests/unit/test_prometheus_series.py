"""The Prometheus endpoint's series at scale: 1,024 simulated ranks' real events through the front's pipeline make no
more per-rank series than 16 do (the top k and the aggregates), a rank that leaves the top k leaves the exposition,
and the spread over ranks is the median, p90 and worst that statistics computes."""

from __future__ import annotations

import statistics
import time

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from ddptop.events import NicStat, RankJoined, RunStarted, StepDone, SystemSample
from ddptop.front.feed import SharedState
from ddptop.front.pipeline import compose
from ddptop.front.prometheus import PHASES, RANK_STATES, SERIES, TOP_K, Exporter
from ddptop.metrics.ranks import spread, top

STEPS = 12


def step(rank: int, k: int, iter_s: float) -> StepDone:
    return StepDone(rank=rank, step=k, epoch=0, segment=0, t=1000.0 + k, iter_s=iter_s, data_s=0.001,
                    compute_s=iter_s / 2, comm_s=iter_s / 4, exposed_comm_s=iter_s / 8, overlap=0.5, batch_size=16,
                    loss=2.0, comm_bytes=1000, tx_bytes=1500, rx_bytes=1500, sampled=k % 10 == 5)


def job_events(world: int, per_node: int, slow: dict[int, float] | None = None) -> list:
    """A job's start and STEPS steps of every rank; rank r's step takes 0.1 s + r µs (the highest ranks are the
    slowest) unless `slow` says otherwise."""
    slow = slow or {}
    events: list = [RunStarted("tiny", "synthetic", world, "ddp", 25.0, False, 16, 0.1, 21000, 84000, 12, (), 20,
                               999.0)]
    for r in range(world):
        host = f"node{r // per_node}"
        events.append(RankJoined(r, world, host, 100 + r, "cpu", "gloo", 1, "2.4", "0.1", "local", 999.0))
        nic = NicStat("eth0", 1e6, 1e6, 10**9, 10**9, 0, 0, 0, 0, 0, 0, 1e6, 1e6)
        events.append(SystemSample(r, host, 999.5, 90.0, 50.0, 10**8, 10**9, 2 * 10**9, "eth0", (nic,)))
    for k in range(STEPS):
        events += [step(r, k, slow.get(r, 0.1 + r * 1e-6)) for r in range(world)]
    return events


def scrape(events: list, world: int, per_node: int) -> tuple[dict, Exporter, SharedState]:
    """The exposition after `events` went through compose's feed, parsed by the client's own parser:
    {sample name: [labels, ...]}."""
    state = SharedState()
    exporter = Exporter(state, job="sim")
    compose(None, sinks=[exporter], state=state).push(events)
    return parse(exporter), exporter, state


def parse(exporter: Exporter) -> dict[str, list[dict]]:
    registry = CollectorRegistry()
    registry.register(exporter)
    out: dict[str, list[dict]] = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for sample in family.samples:
            out.setdefault(sample.name, []).append({**sample.labels, "_value": sample.value})
    return out


def count(series: dict) -> int:
    return sum(len(v) for v in series.values())


def test_1024_ranks_make_no_more_series_than_16_and_the_top_k_are_the_slowest(capsys):
    small, _, _ = scrape(job_events(16, 2), 16, 2)
    big, exporter, state = scrape(job_events(1024, 128), 1024, 128)  # 8 nodes either way
    assert count(big) == count(small)
    per_rank = {name: rows for name, rows in big.items() if name.startswith("ddptop_rank_")}
    assert {r["rank"] for rows in per_rank.values() for r in rows} == {str(r) for r in range(1024 - TOP_K, 1024)}
    assert len(per_rank["ddptop_rank_phase_seconds"]) == TOP_K * len(PHASES)
    assert {r["stat"] for r in big["ddptop_step_seconds"]} == {"median", "p90", "worst"}
    assert len(big["ddptop_ranks"]) == len(RANK_STATES) and len(big["ddptop_tx_bytes_total"]) == 8
    assert sum(r["_value"] for r in big["ddptop_comm_bytes_total"]) == 1024 * STEPS * 1000
    assert big["ddptop_steps_total"][0]["_value"] == STEPS
    # every name in the table is in the exposition (a CPU job's GPU families are declared, empty)
    names = set(big) | {n for n, (kind, _) in SERIES.items() if kind == "gauge" and "gpu" in n}
    assert set(SERIES) <= names

    # 1,024 ranks on 128 nodes of 8: the count docs/how-to/prometheus.md states
    nodes, exporter, _ = scrape(job_events(1024, 8), 1024, 8)
    start = time.perf_counter()
    parse(exporter)
    elapsed = time.perf_counter() - start
    per_node = {n: len(v) for n, v in nodes.items() if all("node" in r and "rank" not in r for r in v)}
    with capsys.disabled():
        print(f"\nPrometheus series: {count(small)} at 16 ranks on 8 nodes, {count(big)} at 1,024 ranks on 8 nodes, "
              f"{count(nodes)} at 1,024 ranks on 128 nodes ({sum(per_node.values())} of them per node); one scrape "
              f"of 1,024 ranks x {STEPS} steps {elapsed * 1e3:.0f} ms")
    assert set(per_node.values()) == {128} and count(nodes) == count(big) + (128 - 8) * len(per_node)


def test_a_rank_that_leaves_the_top_k_leaves_the_exposition():
    world = 64
    state = SharedState()
    exporter = Exporter(state, job="sim")
    feed = compose(None, sinks=[exporter], state=state)
    feed.push(job_events(world, 8))
    ranks = lambda: {r["rank"] for r in parse(exporter)["ddptop_rank_step_seconds"]}  # noqa: E731
    assert ranks() == {str(r) for r in range(world - TOP_K, world)}
    # rank 3 turns slow and rank 63 fast for the next 10 steps (the window the figures are over)
    feed.push([step(r, k, 0.5 if r == 3 else 0.01 if r == world - 1 else 0.1 + r * 1e-6)
               for k in range(STEPS, STEPS + 10) for r in range(world)])
    assert ranks() == {"3", *(str(r) for r in range(world - TOP_K, world - 1))}
    worst = parse(exporter)["ddptop_step_seconds"]
    assert {r["stat"]: r["_value"] for r in worst}["worst"] == 0.5


def test_spread_is_statistics_median_p90_and_the_largest():
    values = [0.3, 0.1, 0.2, 0.9, 0.5]
    s = spread(values)
    assert s["median"] == statistics.median(values) and s["worst"] == 0.9
    assert abs(s["p90"] - (0.5 + 0.6 * (0.9 - 0.5))) < 1e-12  # 90 % of the way from the 4th to the 5th, linearly
    assert spread([0.7]) == {"median": 0.7, "p90": 0.7, "worst": 0.7} and spread([]) == {}
    assert top({0: 0.1, 1: 0.3, 2: 0.3, 3: 0.2}, 2) == [1, 2]


def test_the_endpoint_says_why_it_cannot_listen_in_one_exception_and_frees_its_port():
    import socket

    import ports
    from ddptop.errors import RendezvousError, UsageError
    from ddptop.front.prometheus import Endpoint

    port = ports.port()
    exporter = Exporter(SharedState())
    with socket.socket() as held:
        held.bind(("127.0.0.1", port))
        held.listen()
        with pytest.raises(RendezvousError, match=f"--metrics-port {port} on 127.0.0.1: the port is in use"):
            Endpoint(exporter, port, "127.0.0.1")
    for addr, words in (("no-such-host.invalid", "is no address of this machine"), ("192.0.2.1", "cannot listen")):
        with pytest.raises(UsageError, match=words):
            Endpoint(exporter, port, addr)
    Endpoint(exporter, port, "127.0.0.1").close()
    Endpoint(exporter, port, "127.0.0.1").close()  # closed: the port is free again at once


def test_gpu_series_are_the_ranks_nvml_readings_as_ratios():
    """No GPU here: two ranks' samples carry NVML readings (50 % and 70 %) as a GPU node's would."""
    from ddptop.events import GpuStat

    events = job_events(2, 2)
    gpus = {r: GpuStat(r, "H100", 50.0 + 20 * r, 10**9, 8 * 10**10, 300.0, 60.0) for r in (0, 1)}
    events = [SystemSample(e.rank, e.host, e.t, e.proc_cpu_percent, e.node_cpu_percent, e.proc_rss_bytes,
                           e.node_mem_used_bytes, e.node_mem_total_bytes, e.job_iface, e.nics, (gpus[e.rank],), "ok")
              if isinstance(e, SystemSample) else e for e in events]
    series, _, _ = scrape(events, 2, 2)
    assert series["ddptop_node_gpu_utilization_ratio"] == [{"job": "sim", "node": "node0", "_value": 0.6}]
    by_rank = {r["rank"]: r["_value"] for r in series["ddptop_rank_gpu_utilization_ratio"]}
    assert by_rank == {"0": 0.5, "1": 0.7}
    assert {r["rank"]: r["_value"] for r in series["ddptop_rank_cpu_cores"]} == {"0": 0.9, "1": 0.9}
