"""Step time of plain torch vs ddptop `--probes off` vs `--probes all`, interleaved in the same rank processes.

Separate runs on a 2-core VM differ by ±10% from process placement alone, more than the targets (ddptop vs
plain ≤1.02×, probes all vs off ≤1.01×). Here the three modes alternate in blocks of steps inside one pair of
rank processes on one model, so placement, caches and clock drift hit all three alike:

- plain: the benchmark's own loop (DataLoader, forward, backward, the CS744-style sync or plain DDP, SGD step);
- off:   ddptop's Trainer step with `--probes off` (one perf_counter, the loss as a number);
- all:   ddptop's Trainer step with `--probes all`: clock marks, every collective stamped (DDP through the comm
         hook), per-layer hooks every --span-every step, StepDone/StepSpans built and published through the real
         telemetry bus to a store in the parent (which runs the collector, as the front does), and the
         system sampler thread running.

Each block rebuilds the strategy for its mode (the comm hook belongs to the probe) and drops its first step.

    .venv/bin/python benchmarks/step_overhead_ab.py [--blocks 8] [--block-steps 5] [--model vgg11] [--batch 64]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from plain_torch import sync_gradients  # noqa: E402

from ddptop.config import RunConfig, SyncConfig  # noqa: E402
from ddptop.control import store as stores  # noqa: E402
from ddptop.control.auth import JobKeys  # noqa: E402
from ddptop.control.bus import Collector, Publisher  # noqa: E402
from ddptop.probes.clock import CpuClock  # noqa: E402
from ddptop.probes.comm import CommRecorder  # noqa: E402
from ddptop.probes.off import MinimalStepProbe  # noqa: E402
from ddptop.probes.step import StepProbe  # noqa: E402
from ddptop.sources.sampler import SystemSampler  # noqa: E402
from ddptop.train.loop import Trainer  # noqa: E402

BENCH_KEYS = JobKeys.from_token("benchmark-token", "0" * 32)  # batches sealed as in a real job

CASES = [("single", False), ("gather-scatter", False), ("allreduce", False), ("allreduce", True), ("ddp", False)]
MODES = ("plain", "off", "all")


def plain_step(trainer: Trainer, forward, inputs, labels, criterion, strategy: str, async_op: bool) -> None:
    trainer.optimizer.zero_grad(set_to_none=True)
    loss = criterion(forward(inputs), labels)
    loss.backward()
    if strategy not in ("ddp", "single"):
        sync_gradients(trainer.model, strategy, trainer.rank, trainer.world_size, async_op)
    trainer.optimizer.step()
    loss.item()


def _rank(rank, world, port, store_port, args, out_path):
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    publisher = Publisher(stores.ddptop_view(stores.connect("127.0.0.1", store_port, 30)), rank, BENCH_KEYS)
    lines = []
    for strategy, async_op in CASES:
        sync = SyncConfig(strategy=strategy, async_op=async_op, batch_size=args.batch)
        cfg = RunConfig(model=args.model, sync=sync, eval=False, span_every=args.span_every,
                        synthetic_size=max(12800, args.batch * world * args.blocks * args.block_steps * 3))
        clock = CpuClock()
        probes = {"plain": MinimalStepProbe(rank), "off": MinimalStepProbe(rank),
                  "all": StepProbe(rank, clock, CommRecorder(clock), args.span_every, spans=True)}
        trainer = Trainer(cfg, rank, world, torch.device("cpu"), publisher.emit, probes["off"])
        trainer.start_segment(sync)
        criterion = torch.nn.CrossEntropyLoss()
        iterator = trainer._epoch_iterator()
        times = {m: [] for m in MODES}
        for block in range(args.blocks * len(MODES)):
            mode = MODES[block % len(MODES)]
            trainer.probe = probes[mode]
            trainer.start_segment(sync)
            forward = trainer.forward_module  # for plain DDP: the wrapper with no comm hook (the probe is off)
            sampler = SystemSampler(rank, "bench", "lo", publisher.emit) if mode == "all" else None
            if sampler:
                sampler.start()
            for i in range(args.block_steps):
                dist.barrier()  # every block step starts together on both ranks, as lockstep training does
                t0 = time.perf_counter()
                if mode == "plain":
                    inputs, labels = next(iterator)
                    plain_step(trainer, forward, inputs, labels, criterion, strategy, async_op)
                else:
                    trainer.probe.start(trainer.step)
                    inputs, labels = next(iterator)
                    trainer._train_step(inputs, labels, criterion)
                    trainer._flush_events()
                dt = time.perf_counter() - t0
                if i > 0:
                    times[mode].append(dt)
            if sampler:
                sampler.stop()
        med = {m: statistics.median(times[m]) for m in MODES}
        lines.append(f"{strategy}{' async' if async_op else ''} {med['plain']} {med['off']} {med['all']} "
                     f"{len(times['all'])}")
    publisher.close()
    if rank == 0:
        with open(out_path, "w") as f:
            f.write("\n".join(lines))
    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--blocks", type=int, default=8, help="blocks per mode")
    ap.add_argument("--block-steps", type=int, default=5)
    ap.add_argument("--model", default="vgg11")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--span-every", type=int, default=10)
    args = ap.parse_args()
    server = stores.serve(0)
    collector = Collector(stores.ddptop_view(stores.connect("127.0.0.1", server.port, 30)), 2, BENCH_KEYS)
    done = threading.Event()
    drained = [0]

    def collect():  # the front's job: drain the bus while the ranks train
        while not done.wait(0.2):
            drained[0] += len(collector.poll())

    threading.Thread(target=collect, daemon=True).start()
    out = f"/tmp/ddptop-ab-{os.getpid()}.txt"
    mp.spawn(_rank, args=(2, stores.free_port(), server.port, args, out), nprocs=2)
    done.set()
    print(f"{args.model}, batch {args.batch}/rank, 2 local gloo ranks, {os.cpu_count()} cores; modes interleaved in "
          f"blocks of {args.block_steps} steps, {args.blocks} blocks each; median s/step; "
          f"{drained[0]} events collected\n")
    print("| strategy | plain torch | ddptop --probes off | ddptop --probes all | off / plain | all / plain | all / off |")
    print("|---|---|---|---|---|---|---|")
    with open(out) as f:
        for line in f.read().splitlines():
            *name, plain, off, on, n = line.split()
            p, o, a = float(plain), float(off), float(on)
            print(f"| {' '.join(name)} | {p:.3f} | {o:.3f} | {a:.3f} | {o / p:.3f}× | {a / p:.3f}× | {a / o:.3f}× |")
    os.unlink(out)


if __name__ == "__main__":
    main()
