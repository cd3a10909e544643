"""How many ranks one collector keeps up with (issue 4: ≥64 ranks at 10 steps/s under 20% of a core).

Simulated ranks publish what a real rank does, through the real Publisher: a StepDone every step (10 steps/s),
a StepSpans of 100 spans every 10th step (VGG-11 has ~100 per sampled step) and a SystemSample every 0.5 s.
They run in two other processes; this process hosts the store and runs the collector, like the front process.
Prints the front's CPU use (% of one core: store server + collector) and whether every event arrived in order.

    .venv/bin/python benchmarks/collector_throughput.py [--ranks 16 32 64 128] [--seconds 10]
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
import threading
import time

import psutil

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from ddptop.control import store as stores  # noqa: E402
from ddptop.control.auth import JobKeys  # noqa: E402
from ddptop.control.bus import Collector, Publisher  # noqa: E402
from ddptop.events import NicStat, Span, StepDone, StepSpans, SystemSample  # noqa: E402

BENCH_KEYS = JobKeys.from_token("benchmark-token", "0" * 32, b"benchmark-salt16")  # batches sealed as in a real job

STEP_HZ = 10


def simulated_rank(publisher: Publisher, rank: int, seconds: float) -> None:
    spans = tuple(Span("bwd", f"features.{i}", i * 1e-3, 1e-3) for i in range(70)) + tuple(
        Span("comm", f"bucket {i}", i * 1e-3, 2e-3, 1 << 20, 1 << 20, 1 << 20) for i in range(30))
    nic = NicStat("eth0", 1e8, 1e8, 1 << 30, 1 << 30, 1000, 1000, 0, 0, 0, 0, 2e8, 2e8)
    step = 0
    next_t = time.monotonic()
    stop_at = next_t + seconds
    while time.monotonic() < stop_at:
        now = time.time()
        publisher.emit(StepDone(rank, step, 0, 0, now, 0.1, 0.001, 0.08, 0.03, 0.01, 0.6, 64, 2.3, 36924456,
                                36924456, 36924456, step % 10 == 0))
        if step % 10 == 0:
            publisher.emit(StepSpans(rank, step, 0, now, spans))
        if step % 5 == 0:
            publisher.emit(SystemSample(rank, "node", now, 90.0, 95.0, 1 << 30, 1 << 33, 1 << 34, "eth0", (nic,)))
        step += 1
        next_t += 1 / STEP_HZ
        time.sleep(max(0.0, next_t - time.monotonic()))
    publisher.close()


def rank_group(ranks: list[int], port: int, seconds: float, go) -> None:
    publishers = [Publisher(stores.ddptop_view(stores.connect("127.0.0.1", port, 60)), r, BENCH_KEYS) for r in ranks]
    go.wait()  # every simulated rank starts at once, after all have connected
    threads = [threading.Thread(target=simulated_rank, args=(p, r, seconds)) for p, r in zip(publishers, ranks)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def measure(n_ranks: int, seconds: float) -> tuple[float, int, bool, float]:
    port = stores.free_port()
    server = stores.serve(port)
    collector = Collector(stores.ddptop_view(stores.connect("127.0.0.1", port, 30)), n_ranks, BENCH_KEYS)
    ctx = multiprocessing.get_context("spawn")
    go = ctx.Event()
    groups = [ctx.Process(target=rank_group, args=(list(range(g, n_ranks, 2)), port, seconds, go))
              for g in range(2)]
    for g in groups:
        g.start()
    me = psutil.Process()
    events, max_poll = [], 0.0
    while len(collector.present) < n_ranks:
        events += collector.poll()
        time.sleep(0.2)
    go.set()
    stop_at = time.monotonic() + seconds
    cpu0, t0 = me.cpu_times(), time.monotonic()
    while time.monotonic() < stop_at:
        started = time.monotonic()
        events += collector.poll()
        max_poll = max(max_poll, time.monotonic() - started)
        time.sleep(0.2)
    cpu1, t1 = me.cpu_times(), time.monotonic()
    for g in groups:
        g.join()
    events += collector.poll()
    del server
    busy = (cpu1.user - cpu0.user + cpu1.system - cpu0.system) / (t1 - t0)
    steps = [e for e in events if isinstance(e, StepDone)]
    in_order = all([d.step for d in steps if d.rank == r] == list(range(len([d for d in steps if d.rank == r])))
                   for r in range(n_ranks))
    return busy, len(steps) / seconds, in_order, max_poll


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, nargs="+", default=[16, 32, 64, 128])
    ap.add_argument("--seconds", type=float, default=10)
    args = ap.parse_args()
    print(f"{os.cpu_count()} cores; simulated ranks at {STEP_HZ} steps/s for {args.seconds:g} s each\n")
    print("| ranks | steps/s received | front CPU (% of a core) | slowest poll | every step once, in order |")
    print("|---|---|---|---|---|")
    for n in args.ranks:
        busy, count, in_order, max_poll = measure(n, args.seconds)
        print(f"| {n} | {count:.0f} | {busy:.1%} | {max_poll * 1e3:.0f} ms | "
              f"{'yes' if in_order else 'NO'} |", flush=True)


if __name__ == "__main__":
    main()
