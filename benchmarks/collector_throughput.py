"""How many ranks one front keeps up with (issue 41: 1,024 ranks at 10 steps/s, the front under one core).

Simulated ranks send what a real rank's Publisher sends, through the real transport (each rank its own PUSH socket
with the rank's CURVE key, to the front's hub), a batch every 0.25 s: a StepDone every step (10 steps/s), a StepSpans
of 100 spans on each sampled step (VGG-11 has ~100; a rank samples every 10th step, every (ranks / 16)th above 160
ranks: metrics.span_cadence, or `--span-every N` as a user would set it) and a SystemSample every 0.5 s, plus a heartbeat a
second on a socket of its own, as a rank's control thread sends it. The batches are filled from templates in the
Publisher's forms (steps as binary step blocks, the rest JSON; its own encoding for 1,024 ranks would take more than
this machine's two cores); they run in two other
processes; this process hosts
the hub (control/hub.py: receive, check each rank's order, decode, republish for attach) and drains its source as
the front's pipeline does. Prints the front's CPU use (% of one core), its memory (RSS), and whether every step of
every rank arrived once and in order.

    .venv/bin/python benchmarks/collector_throughput.py [--ranks 16 64 256 1024] [--seconds 10] [--span-every N]
"""

from __future__ import annotations

import argparse
import itertools
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

from ddptop import metrics  # noqa: E402
from ddptop.control import transport  # noqa: E402
from ddptop.control.auth import JobKeys  # noqa: E402
from ddptop.control.bus import BEAT, TEL  # noqa: E402
from ddptop.control.hub import Hub  # noqa: E402
from ddptop.events import (STEP_RECORD, NicStat, Span, StepDone, StepSpans, SystemSample, TelemetryGap,  # noqa: E402
                           step_block)

BENCH_KEYS = JobKeys.from_token("benchmark-token", "0" * 32, b"benchmark-salt16")
RANK_KEYS = JobKeys(BENCH_KEYS.job_id, BENCH_KEYS.ranks, BENCH_KEYS.namespace, b"", transport.server_public(BENCH_KEYS))
STEP_HZ = 10


def more_files() -> None:
    """Each socket holds a few descriptors: 512 simulated ranks a process need more than the usual 1,024."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def templates(rank: int) -> tuple[list, str, str]:
    """What a rank's Publisher sends for a step (StepDone's values, packed as its binary record with the step
    filled in), a sampled step's spans and a system sample (JSON, the step left to fill in) (1,024 ranks' own encoding would need more cores than this benchmark's machine has; the
    front decodes it all, as it decodes a real rank's)."""
    spans = tuple(Span("bwd", f"features.{i}", i * 1e-3, 1e-3) for i in range(70)) + tuple(
        Span("comm", f"bucket {i}", i * 1e-3, 2e-3, 1 << 20, 1 << 20, 1 << 20) for i in range(30))
    nic = NicStat("eth0", 1e8, 1e8, 1 << 30, 1 << 30, 1000, 1000, 0, 0, 0, 0, 2e8, 2e8)
    now = time.time()
    step = StepDone(rank, 777777, 0, 0, now, 0.1, 0.001, 0.08, 0.03, 0.01, 0.6, 64, 2.3, 36924456, 36924456, 36924456,
                    False)
    fill = lambda event: json.dumps(event.to_wire()).replace("%", "%%").replace("777777", "%d")  # noqa: E731
    return (list(step.__dict__.values()), fill(StepSpans(rank, 777777, 0, now, spans)),
            fill(SystemSample(rank, "node", now, 90.0, 95.0, 1 << 30, 1 << 33, 1 << 34, "eth0", (nic,))).replace("%d", "0"))


def batch_parts(items: list[tuple[bool, bytes]]) -> list[bytes]:
    """The parts a Publisher makes of these items (control/bus.Publisher._next_batch): a JSON list in which each run
    of steps is its length, and a step block of their records."""
    listed, records = [], []
    for is_step, run in itertools.groupby(items, key=lambda item: item[0]):
        encoded = [b for _, b in run]
        if is_step:
            listed.append(b"%d" % len(encoded))
            records += encoded
        else:
            listed += encoded
    blob = b"[" + b",".join(listed) + b"]"
    return [blob, step_block(records)] if records else [blob]


def rank_group(ranks: list[int], ports: dict, seconds: float, every: int, ready, go) -> None:
    """Every 0.25 s each rank sends one batch of what it did since (a Publisher's interval), on its own PUSH socket
    with the rank's key; once a second a heartbeat on a second socket, as its control thread does."""
    more_files()
    transport.context().set(zmq.MAX_SOCKETS, 8 * len(ranks) + 64)
    tel = transport.endpoint("127.0.0.1", ports["tel"])
    socks = [transport.client_socket(zmq.PUSH, RANK_KEYS, "rank", tel, SNDHWM=transport.SEND_HWM) for _ in ranks]
    beats = [transport.client_socket(zmq.PUSH, RANK_KEYS, "rank", tel, SNDHWM=4) for _ in ranks]
    made = [templates(r) for r in ranks]
    ready.set()
    go.wait()  # every simulated rank starts at once, after all have connected
    start = time.monotonic()
    sent, seq, tick = 0, 0, 0
    while sent < seconds * STEP_HZ:
        tick += 1
        due = min(int((time.monotonic() - start) * STEP_HZ), int(seconds * STEP_HZ))
        if due > sent:
            seq += 1
            for sock, beat, rank, (step, spans, sample) in zip(socks, beats, ranks, made):
                items: list[tuple[bool, bytes]] = []  # (a step record?, its bytes), in the Publisher's order
                for n in range(sent, due):
                    step[1] = n
                    items.append((True, STEP_RECORD.pack(*step)))
                    if n % every == 0:
                        items.append((False, (spans % n).encode()))
                    if n % 5 == 0:
                        items.append((False, sample.encode()))
                sock.send_multipart([TEL, str(rank).encode(), str(seq).encode(), *batch_parts(items)])
                if seq % 4 == 1:
                    beat.send_multipart([BEAT, str(rank).encode(), json.dumps({"step": due, "beat": seq}).encode()])
            sent = due
        time.sleep(max(0.0, start + tick * 0.25 - time.monotonic()))
    for sock in socks + beats:
        sock.close(linger=10000)


def measure(n_ranks: int, seconds: float, every: int) -> tuple[float, float, float, str, float]:
    more_files()
    hub = Hub("127.0.0.1", BENCH_KEYS, n_ranks)
    ctx = multiprocessing.get_context("spawn")
    go = ctx.Event()
    readies = [ctx.Event() for _ in range(2)]
    groups = [ctx.Process(target=rank_group, args=(list(range(g, n_ranks, 2)), hub.endpoints(), seconds, every, ready, go))
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
    for g in groups:
        g.join()
    expected = n_ranks * int(seconds * STEP_HZ)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and sum(len(s) for s in steps.values()) < expected:  # a backlog, if any
        drain()
        rss = max(rss, me.memory_info().rss)
        time.sleep(0.2)
    late = time.monotonic() - stop_at  # the last step arrived this long after the ranks sent it
    cpu1 = me.cpu_times()  # everything received: its whole cost, per second of the ranks' traffic
    time.sleep(1)
    drain()
    hub.close()
    busy = (cpu1.user - cpu0.user + cpu1.system - cpu0.system) / seconds
    received = sum(len(s) for s in steps.values())
    in_order = all(s == list(range(len(s))) for s in steps.values())
    silent = n_ranks - len(steps)  # ranks of which not one step arrived (their connection never made it)
    ok = "yes" if in_order and not silent and not gaps and received == expected else \
        (f"no: {received}/{expected} received by then, {gaps} gaps, {'in' if in_order else 'OUT OF'} order, "
         f"{silent} ranks heard from not at all")
    return busy, received / seconds, rss / 2**20, ok, late


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, nargs="+", default=[16, 64, 256, 1024])
    ap.add_argument("--seconds", type=float, default=10)
    ap.add_argument("--span-every", type=int, default=0, help="as ddptop's flag (0: its default for the world size)")
    args = ap.parse_args()
    print(f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}; simulated ranks at {STEP_HZ} steps/s for "
          f"{args.seconds:g} s each\n")
    print("| ranks | spans every | steps/s sent | front CPU (% of a core) | front RSS (peak) | last step received "
          "after | every step once, in order |")
    print("|---|---|---|---|---|---|---|")
    for n in args.ranks:
        every = metrics.span_cadence(args.span_every, n)
        busy, rate, rss, ok, late = measure(n, args.seconds, every)
        print(f"| {n} | {every} | {rate:.0f} | {busy:.1%} | {rss:.0f} MiB | {max(0.0, late):.1f} s | {ok} |",
              flush=True)


if __name__ == "__main__":
    main()
