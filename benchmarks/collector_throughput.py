"""How many ranks one front keeps up with (issue 41: 1,024 ranks at 10 steps/s, the front under one core).

Simulated ranks publish what a real rank does, through the real Publisher and the real transport (each rank its own
PUSH socket with the rank's CURVE key, to the front's hub): a StepDone every step (10 steps/s), a StepSpans of 100
spans every 10th step (VGG-11 has ~100 per sampled step) and a SystemSample every 0.5 s, plus a heartbeat a second
on a socket of its own, as a rank's control thread sends it. They run in two other processes; this process hosts
the hub (control/hub.py: receive, check each rank's order, decode, republish for attach) and drains its source as
the front's pipeline does. Prints the front's CPU use (% of one core), its memory (RSS), and whether every step of
every rank arrived once and in order.

    .venv/bin/python benchmarks/collector_throughput.py [--ranks 16 64 256 1024] [--seconds 10]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import resource
import sys
import threading
import time

import psutil
import zmq

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from ddptop.control import transport  # noqa: E402
from ddptop.control.auth import JobKeys  # noqa: E402
from ddptop.control.bus import BEAT, Publisher  # noqa: E402
from ddptop.control.hub import Hub  # noqa: E402
from ddptop.events import NicStat, Span, StepDone, StepSpans, SystemSample, TelemetryGap  # noqa: E402

BENCH_KEYS = JobKeys.from_token("benchmark-token", "0" * 32, b"benchmark-salt16")
RANK_KEYS = JobKeys(BENCH_KEYS.job_id, BENCH_KEYS.ranks, BENCH_KEYS.namespace, b"", transport.server_public(BENCH_KEYS))
STEP_HZ = 10


def more_files() -> None:
    """Each socket holds a few descriptors: 512 simulated ranks a process need more than the usual 1,024."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def rank_group(ranks: list[int], ports: dict, seconds: float, ready, go) -> None:
    more_files()
    transport.context().set(zmq.MAX_SOCKETS, 8 * len(ranks) + 64)
    tel = transport.endpoint("127.0.0.1", ports["tel"])
    publishers = [Publisher(transport.client_socket(zmq.PUSH, RANK_KEYS, "rank", tel, SNDHWM=transport.SEND_HWM), r)
                  for r in ranks]
    beats = [transport.client_socket(zmq.PUSH, RANK_KEYS, "rank", tel, SNDHWM=4) for _ in ranks]
    spans = tuple(Span("bwd", f"features.{i}", i * 1e-3, 1e-3) for i in range(70)) + tuple(
        Span("comm", f"bucket {i}", i * 1e-3, 2e-3, 1 << 20, 1 << 20, 1 << 20) for i in range(30))
    nic = NicStat("eth0", 1e8, 1e8, 1 << 30, 1 << 30, 1000, 1000, 0, 0, 0, 0, 2e8, 2e8)
    ready.set()
    go.wait()  # every simulated rank starts at once, after all have connected
    next_t = time.monotonic()
    stop_at = next_t + seconds
    step = 0
    while time.monotonic() < stop_at:  # one thread drives them all: a rank's training thread only appends
        now = time.time()
        for p, b, rank in zip(publishers, beats, ranks):
            p.emit(StepDone(rank, step, 0, 0, now, 0.1, 0.001, 0.08, 0.03, 0.01, 0.6, 64, 2.3, 36924456,
                            36924456, 36924456, step % 10 == 0))
            if step % 10 == 0:
                p.emit(StepSpans(rank, step, 0, now, spans))
                b.send_multipart([BEAT, str(rank).encode(), json.dumps({"step": step, "beat": step + 1}).encode()])
            if step % 5 == 0:
                p.emit(SystemSample(rank, "node", now, 90.0, 95.0, 1 << 30, 1 << 33, 1 << 34, "eth0", (nic,)))
        step += 1
        next_t += 1 / STEP_HZ
        time.sleep(max(0.0, next_t - time.monotonic()))
    for p in publishers:
        p.close()
    for b in beats:
        b.close(linger=1000)


def measure(n_ranks: int, seconds: float) -> tuple[float, float, float, bool, int]:
    more_files()
    hub = Hub("127.0.0.1", BENCH_KEYS, n_ranks)
    ctx = multiprocessing.get_context("spawn")
    go = ctx.Event()
    readies = [ctx.Event() for _ in range(2)]
    groups = [ctx.Process(target=rank_group, args=(list(range(g, n_ranks, 2)), hub.endpoints(), seconds, ready, go))
              for g, ready in enumerate(readies)]
    for g in groups:
        g.start()
    for ready in readies:
        ready.wait(300)
    me = psutil.Process()
    time.sleep(1)  # the connections' handshakes done
    go.set()
    steps: dict[int, list[int]] = {}
    gaps = 0
    cpu0, t0 = me.cpu_times(), time.monotonic()
    stop_at = t0 + seconds
    rss = 0

    def drain() -> None:
        nonlocal gaps
        for e in hub.source.poll():
            if isinstance(e, StepDone):
                steps.setdefault(e.rank, []).append(e.step)
            elif isinstance(e, TelemetryGap):
                gaps += 1

    while time.monotonic() < stop_at:  # the front's pipeline drains its source every 0.2 s
        drain()
        rss = max(rss, me.memory_info().rss)
        time.sleep(0.2)
    cpu1, t1 = me.cpu_times(), time.monotonic()
    for g in groups:
        g.join()
    deadline = time.monotonic() + 30
    expected = sum(1 for _ in range(int(seconds * STEP_HZ)))
    while time.monotonic() < deadline and sum(len(s) for s in steps.values()) < n_ranks * expected * 0.99:
        drain()
        time.sleep(0.2)
    time.sleep(1)
    drain()
    hub.close()
    busy = (cpu1.user - cpu0.user + cpu1.system - cpu0.system) / (t1 - t0)
    received = sum(len(s) for s in steps.values())
    in_order = len(steps) == n_ranks and all(s == list(range(len(s))) for s in steps.values())
    return busy, received / seconds, rss / 2**20, in_order and not gaps, gaps


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, nargs="+", default=[16, 64, 256, 1024])
    ap.add_argument("--seconds", type=float, default=10)
    args = ap.parse_args()
    print(f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}; simulated ranks at {STEP_HZ} steps/s for "
          f"{args.seconds:g} s each\n")
    print("| ranks | steps/s received | front CPU (% of a core) | front RSS (peak) | every step once, in order |")
    print("|---|---|---|---|---|")
    for n in args.ranks:
        busy, rate, rss, ok, gaps = measure(n, args.seconds)
        print(f"| {n} | {rate:.0f} | {busy:.1%} | {rss:.0f} MiB | {'yes' if ok else f'NO ({gaps} gaps)'} |",
              flush=True)


if __name__ == "__main__":
    main()
