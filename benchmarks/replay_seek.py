"""Opening and seeking a long recording (issue 5: 1 hour × 8 ranks, open and seek anywhere under 1 s).

Generates a recording of realistic rates through the real RecordingWriter: per rank VGG-11 at 2 steps/s
(a StepDone each step), 100 spans every 10th step (like `--span-every 10`), a system sample every 0.5 s with
4 network interfaces; plus joins, the run start and a config switch every 15 minutes. Measured values are
random floats at full precision, as real timings are. Then it times opening the file with a ReplaySource,
seeking to random steps and times (each seek followed by the poll() that returns the history a UI redraws
from), and the same open + seek + poll in a fresh Python process (imports included). Last, how much a
recording loses when its process is killed: a process feeds a writer a step every 5 ms and is killed with
SIGKILL at a random moment, `--kills` times; the age of the newest step in the file is what was lost.

    .venv/bin/python benchmarks/replay_seek.py [--ranks 8] [--hours 1] [--seeks 50] [--kills 10] [--out FILE]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from ddptop.events import ConfigApplied  # noqa: E402
from ddptop.events import (NicStat, RankJoined, RunFinished, RunStarted, Span, StepDone, StepSpans,  # noqa: E402
                           SystemSample)
from ddptop.record.reader import Recording  # noqa: E402
from ddptop.record.replay import ReplaySource  # noqa: E402
from ddptop.record.sqlite import RecordingWriter, base_meta  # noqa: E402

STEP_HZ, SPAN_EVERY, SAMPLE_HZ = 2.0, 10, 2.0
CONFIGS = [{"strategy": s, "bucket_mb": 25.0, "async_op": False, "batch_size": 64, "lr": 0.1}
           for s in ("ddp", "allreduce", "gather-scatter", "ddp")]


def span_templates(rng: random.Random, n: int = 8) -> list[tuple[Span, ...]]:
    """VGG-11-like steps: 29 forward and 29 backward layer spans, 22 per-parameter collectives, data, wait, opt."""
    out = []
    for _ in range(n):
        spans, t = [Span("data", "data", 0.0, rng.uniform(1e-3, 3e-3))], 3e-3
        for kind in ("fwd", "bwd"):
            for i in range(29):
                d = rng.uniform(1e-3, 2e-2)
                spans.append(Span(kind, f"features.{i}", t, d))
                t += d
        for i in range(22):
            nbytes = rng.randrange(1 << 10, 1 << 24)
            spans.append(Span("comm", f"allreduce features.{i}.weight", t - rng.uniform(0, 0.2),
                              rng.uniform(1e-3, 5e-2), nbytes, nbytes, nbytes))
        spans += [Span("wait", "wait", t, rng.uniform(1e-3, 1e-2)),
                  Span("opt", "optimizer", t + 0.01, rng.uniform(1e-3, 5e-3))]
        out.append(tuple(spans))
    return out


def nics(rng: random.Random, elapsed: float) -> tuple[NicStat, ...]:
    out = []
    for name in ("eth0", "eth1", "ib0", "lo"):
        rate = rng.uniform(1e6, 1e9)
        total = int(rate * elapsed)
        out.append(NicStat(name, rate, rate * 0.97, total, total, total // 1400, total // 1400, 0, 0, 0, 0,
                           rate * 1.3, rate * 1.2))
    return tuple(out)


def generate(path: str, ranks: int, hours: float, seed: int = 0) -> tuple[int, float]:
    """Write the recording; returns (events, seconds the writer took from first event to closed file)."""
    rng = random.Random(seed)
    templates = span_templates(rng)
    t0 = 1.7e9
    writer = RecordingWriter(path, base_meta({"model": "vgg11", "sync": CONFIGS[0]}, {"source": "bench",
                                                                                          "world_size": ranks}))
    start = time.perf_counter()
    head = [RankJoined(r, ranks, f"node{r // 4}", 1000 + r, "cpu", "gloo", 8, "2.x", "0.1.0", "bench", t0)
            for r in range(ranks)]
    head.append(RunStarted("vgg11", "synthetic", ranks, "ddp", 25.0, False, 64, 0.1, 9231114, 36924456, 34,
                           tuple((f"features.{i}", 1000 * i) for i in range(29)), 195, t0))
    writer.handle(head + [ConfigApplied(r, 0, 0, CONFIGS[0], 0, "start", t0) for r in range(ranks)])
    steps = int(hours * 3600 * STEP_HZ)
    per_segment = steps // len(CONFIGS)
    count = len(head) + ranks
    batch = []
    for step in range(steps):
        t = t0 + step / STEP_HZ
        segment = min(step // per_segment, len(CONFIGS) - 1)
        if step and step % per_segment == 0 and segment == step // per_segment:
            batch += [ConfigApplied(r, step, segment, CONFIGS[segment], segment, "bench", t) for r in range(ranks)]
        for r in range(ranks):
            iter_s = rng.uniform(0.4, 0.6)
            batch.append(StepDone(r, step, 0, segment, t + rng.uniform(0, 0.01), iter_s, rng.uniform(0, 0.01),
                                  rng.uniform(0.2, 0.3), rng.uniform(0.1, 0.2), rng.uniform(0, 0.1), rng.random(), 64,
                                  rng.uniform(0.5, 2.5), 36924456, 36924456, 36924456, step % SPAN_EVERY == 0))
            if step % SPAN_EVERY == 0:
                batch.append(StepSpans(r, step, segment, t - iter_s, rng.choice(templates)))
            for k in range(int(SAMPLE_HZ / STEP_HZ)):
                ts = t + k / SAMPLE_HZ
                batch.append(SystemSample(r, f"node{r // 4}", ts, rng.uniform(80, 100), rng.uniform(80, 100),
                                          rng.randrange(1 << 30, 1 << 32), 1 << 34, 1 << 36, "eth0",
                                          nics(rng, ts - t0)))
        if len(batch) >= 2000:  # the collector hands batches over every 0.2 s
            writer.handle(batch)
            count += len(batch)
            batch = []
    batch += [RunFinished(r, steps, "done", t0 + steps / STEP_HZ) for r in range(ranks)]
    writer.handle(batch)
    count += len(batch)
    writer.close()
    return count, time.perf_counter() - start


def time_seeks(path: str, seeks: int, seed: int = 1) -> dict:
    rng = random.Random(seed)
    start = time.perf_counter()
    source = ReplaySource(path, playing=False)
    open_s = time.perf_counter() - start
    last_step, t_end = source.status()["step_end"], source.t_end
    step_times, time_times, sizes = [], [], []
    for _ in range(seeks):
        for seek, arg, out in ((source.seek_step, rng.randrange(last_step + 1), step_times),
                               (source.seek_time, rng.uniform(0, t_end), time_times)):
            start = time.perf_counter()
            seek(arg)
            sizes.append(len(source.poll()))
            out.append(time.perf_counter() - start)
    source.close()
    return {"open_s": open_s, "step": step_times, "time": time_times, "history_events": statistics.median(sizes)}


FRESH = """
import sys, time
start = time.perf_counter()
from ddptop.record.replay import ReplaySource
s = ReplaySource(sys.argv[1], playing=False)
s.seek_step(int(sys.argv[2]))
n = len(s.poll())
print(time.perf_counter() - start, 'torch' in sys.modules)
"""


def fresh_process(path: str, step: int) -> tuple[float, bool]:
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = subprocess.run([sys.executable, "-c", FRESH, path, str(step)], capture_output=True, text=True, check=True,
                         cwd=root).stdout.split()
    return float(out[0]), out[1] == "True"


FEEDER = """
import sys, time
from ddptop.events import StepDone
from ddptop.record.sqlite import RecordingWriter, base_meta
writer = RecordingWriter(sys.argv[1], base_meta({}, {}))
print("ready", flush=True)
step = 0
while True:
    writer.handle([StepDone(0, step, 0, 0, time.time(), 0.005, 0, 0, 0, 0, 0, 1, 1.0, 0, 0, 0, False)])
    step += 1
    time.sleep(0.005)
"""


def kill_losses(folder: str, kills: int, seed: int = 2) -> list[float]:
    """Seconds between the kill and the newest step the file kept, per kill."""
    rng, root = random.Random(seed), os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = []
    for i in range(kills):
        path = os.path.join(folder, f"killed-{i}.db")
        proc = subprocess.Popen([sys.executable, "-c", FEEDER, path], stdout=subprocess.PIPE, text=True, cwd=root)
        proc.stdout.readline()
        time.sleep(rng.uniform(1.0, 3.0))
        killed_at = time.time()
        proc.kill()
        proc.wait()
        with Recording.open(path) as rec:
            steps = [d.step for d in rec.step_events()]
            newest = rec.query("SELECT max(t) FROM steps")[0][0]
        assert steps == list(range(len(steps))), "a step is missing"
        out.append(killed_at - newest)
        for suffix in ("", "-wal", "-shm", "-reserve"):  # a killed writer leaves its disk-full reserve too
            if os.path.exists(path + suffix):
                os.remove(path + suffix)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", type=int, default=8)
    p.add_argument("--hours", type=float, default=1.0)
    p.add_argument("--seeks", type=int, default=50)
    p.add_argument("--kills", type=int, default=10)
    p.add_argument("--out", help="keep the generated recording here (default: a temporary file)")
    args = p.parse_args()
    folder = tempfile.mkdtemp(prefix="ddptop-bench-")
    path = args.out or os.path.join(folder, "long.db")
    events, write_s = generate(path, args.ranks, args.hours)
    size = os.path.getsize(path)
    r = time_seeks(path, args.seeks)
    steps = int(args.hours * 3600 * STEP_HZ)
    fresh, torch_loaded = fresh_process(path, steps // 2)
    losses = kill_losses(folder, args.kills) if args.kills else []
    ms = lambda xs: f"{statistics.median(xs) * 1e3:.0f} ms median, {max(xs) * 1e3:.0f} ms max"  # noqa: E731
    print(f"| recording | {args.hours:g} h × {args.ranks} ranks, {events:,} events, written in {write_s:.0f} s "
          f"({events / write_s:,.0f} events/s) |")
    print("|---|---|")
    print(f"| file size | {size / 1e6:.1f} MB ({size / 1e6 / (args.hours * args.ranks):.1f} MB per rank-hour) |")
    print(f"| open (ReplaySource) | {r['open_s'] * 1e3:.0f} ms |")
    print(f"| seek to a random step + poll the history | {ms(r['step'])} ({args.seeks} seeks) |")
    print(f"| seek to a random time + poll the history | {ms(r['time'])} ({args.seeks} seeks) |")
    print(f"| history returned after a seek | {r['history_events']:.0f} events (median) |")
    print(f"| fresh process: import + open + seek + poll | {fresh * 1e3:.0f} ms (torch imported: {torch_loaded}) |")
    if losses:
        print(f"| SIGKILL mid-stream: newest step kept | {statistics.median(losses):.2f} s median, "
              f"{max(losses):.2f} s max before the kill ({len(losses)} kills) |")
    if not args.out:
        os.remove(path)
    os.rmdir(folder)


if __name__ == "__main__":
    main()
