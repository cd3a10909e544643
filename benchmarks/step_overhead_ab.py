"""The whole training loop: plain torch vs ddptop `--probes off` vs `--probes all`, interleaved in the same ranks.

Separate runs on a 2-core VM differ by ±10% from process placement alone, more than the targets. Here the three
modes alternate in blocks of steps inside one pair of rank processes on one model, so placement, caches and
clock drift hit all three alike. Every mode is timed the same way: the wall clock of a block of whole loop
iterations, from one loop top to the one B iterations later (the data loader, forward, backward, the sync, the
optimizer step, and whatever the loop does around them):

- plain: the benchmark's own loop (CS744-style sync or plain DDP), `loss.item()` every step;
- off:   ddptop's real loop body with `--probes off`: the step boundary (the control agent's pipelined exchange,
         a real ControlAgent with its control thread), the step probe, events to the real telemetry bus;
- all:   the same with `--probes all`: clock marks, every collective stamped (DDP through the comm hook), layer
         hooks every --span-every step, spans resolved on the publisher thread, the system sampler running.

On the CPU the two ranks start as `ddptop run --local 2` starts its ranks (cli/run.py, front/forks.py): OMP_NUM_THREADS
set to their thread count before torch loads, and forked from a server forked out of this process, so neither imports
torch again (two spawned interpreters were ~15 of the smallest run's ~25 CPU-s).

After each strategy's interleaved blocks come the front's: each mode runs --front-rounds blocks of --front-steps
steps, and the front's process CPU (this process, running the job's real pipeline: front.pipeline.compose, its
state, derived events and a recording) is read from the kernel before a block and once every rank's marker sent
after it is recorded. The second table adds it to rank 0's: the whole CPU per step that issue 42's targets are about
(rank 0's other threads and the front's collector included; the screen is not).

Besides the ratios it reports ddptop's own cost measured from inside: the median `own_s` of the StepDone events
the ranks published (time the training thread spent in ddptop code), in µs and as a share of the step; and the CPU
each mode cost per step, counted by the kernel for rank 0's whole process (`time.process_time`: the training thread,
the publisher, the control agent and the system sampler alike), in the same interleaved blocks, so the drift between
separate runs that `cpu_per_step.py` fights cancels here. On a GPU that column also holds the host's waits: the plain
loop's `loss.item()` every step waits for the device, and a CUDA wait may spin.

    .venv/bin/python benchmarks/step_overhead_ab.py [--blocks 4] [--block-steps 10] [--model vgg11] [--batch 64]
        [--cases single,ddp,...] [--device cuda] [--ranks 1|2] [--front-steps 600] [--front-rounds 3]

`--device cuda`: one rank on GPU 0 under nccl (world size 1, so the sync strategies are their single-rank paths),
CUDA-event clocks, and `torch.cuda.synchronize()` before and after each timed block (never inside one). A GPU step is
short (VGG-11 at batch 64: ~6 ms on an H200), so the host's Python time per step is what this measures there; a
CPU step of the tiny model at batch 2 (~3 ms) is the same regime on this machine (`--model tiny --batch 2`).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import sys
import tempfile
import threading
import time
from multiprocessing import forkserver

CASES = [("single", False), ("gather-scatter", False), ("allreduce", False), ("allreduce", True), ("ddp", False)]


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser()
    ap.add_argument("--blocks", type=int, default=4, help="blocks per mode")
    ap.add_argument("--block-steps", type=int, default=10, help="timed steps per block (one sampled step in 10)")
    ap.add_argument("--model", default="vgg11")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--span-every", type=int, default=10)
    ap.add_argument("--front-steps", type=int, default=600,
                    help="steps per front block: the front's CPU per step, each mode, after the interleaved blocks")
    ap.add_argument("--front-rounds", type=int, default=3, help="front blocks per mode (0: no front measurement)")
    ap.add_argument("--cases", default=",".join(f"{s}{' async' if a else ''}" for s, a in CASES),
                    help="which strategies, comma-separated (default: all five)")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                    help="cuda: one rank on GPU 0 with nccl (world size 1); cpu: gloo ranks (--ranks)")
    ap.add_argument("--ranks", type=int, choices=(1, 2), default=2,
                    help="CPU ranks (issue 42's targets are for one rank at `single`; two show the exchange's cost)")
    return ap


if __name__ == "__main__" and parser().parse_known_args()[0].device == "cpu":
    # the CPU ranks fork from this process (main): their thread count set before torch loads, as `ddptop run` sets
    # it (cli/run.py), so that every thread of a rank (gloo's too) computes with it
    _ranks = parser().parse_known_args()[0].ranks
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // _ranks)))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from plain_torch import sync_gradients  # noqa: E402

from ddptop.config import RunConfig, SyncConfig  # noqa: E402
import zmq  # noqa: E402

from ddptop.control import store as stores  # noqa: E402
from ddptop.control import transport  # noqa: E402
from ddptop.control.agent import ControlAgent, Decision, Link  # noqa: E402
from ddptop.control.auth import JobKeys  # noqa: E402
from ddptop.control.bus import Publisher  # noqa: E402
from ddptop.control.hub import Hub  # noqa: E402
from ddptop.events import LogLine, StepDone  # noqa: E402
from ddptop.probes.clock import clock_for  # noqa: E402
from ddptop.probes.step import StepProbe  # noqa: E402
from ddptop.front import forks  # noqa: E402
from ddptop.front.pipeline import compose  # noqa: E402
from ddptop.record.sqlite import RecordingWriter, base_meta  # noqa: E402
from ddptop.sources.sampler import SystemSampler  # noqa: E402
from ddptop.train import lifetime  # noqa: E402
from ddptop.train.loop import Trainer  # noqa: E402

BENCH_KEYS = JobKeys.from_token("benchmark-token", "0" * 32, b"benchmark-salt16")  # batches over CURVE as in a real job

MODES = ("plain", "off", "all")


def plain_iteration(trainer: Trainer, forward, iterator, criterion, strategy: str, async_op: bool) -> None:
    inputs, labels = next(iterator)
    inputs = inputs.to(trainer.device, non_blocking=True)  # what a plain loop does (pinned batches on a GPU)
    labels = labels.to(trainer.device, non_blocking=True)
    trainer.optimizer.zero_grad(set_to_none=True)
    loss = criterion(forward(inputs), labels)
    loss.backward()
    if strategy not in ("ddp", "single"):
        sync_gradients(trainer.model, strategy, trainer.rank, trainer.world_size, async_op)
    trainer.optimizer.step()
    loss.item()


def cycle(loader):
    """The plain loop's batches, epoch after epoch (a front block is longer than a small data set's epoch)."""
    while True:
        yield from loader


def process_cpu_ns(pid: int) -> int:
    """Every thread's CPU time of process `pid` so far, as the kernel counts it (ns, /proc/PID/task/TID/schedstat)."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                total += int(f.read().split()[0])
        except (OSError, ValueError, IndexError):  # a thread that ended between the listing and the read
            pass
    return total


def ddptop_iteration(trainer: Trainer, agent: ControlAgent, criterion) -> None:
    """What Trainer.run does for one step (the loop body, unchanged)."""
    trainer.probe.begin()
    trainer._boundary(agent)
    trainer.probe.ready(trainer.step, trainer.segment, trainer.segment_start)
    trainer._train_step(trainer._next_batch(criterion), criterion)


def _rank(rank, world, port, hub_ports, args, out_path, front_pid, front_mark):
    cuda = args.device == "cuda"
    if not cuda:  # forked, as a ddptop CPU rank starts: what it inherited frozen, the collector on (off in its server)
        lifetime.settle()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS") or max(1, (os.cpu_count() or 1) // world)))
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if cuda else "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)

    def settle():  # a timed block starts and ends with the device idle (no-op on the CPU)
        if cuda:
            torch.cuda.synchronize()

    def connect():  # the agent's sockets to the front's hub, as a rank's (train/worker.py)
        return Link("127.0.0.1", hub_ports, BENCH_KEYS, rank)

    publisher = Publisher(transport.client_socket(zmq.PUSH, BENCH_KEYS, "rank",
                                                  transport.endpoint("127.0.0.1", hub_ports["tel"]),
                                                  SNDHWM=transport.SEND_HWM), rank)
    clock = clock_for(device.type)
    probes = {"plain": StepProbe(rank, clock, publisher.emit, detail=False),
              "off": StepProbe(rank, clock, publisher.emit, detail=False),
              "all": StepProbe(rank, clock, publisher.emit, args.span_every, spans=True)}
    first = SyncConfig(strategy="single", batch_size=args.batch)
    cfg = RunConfig(model=args.model, sync=first, eval=False, span_every=args.span_every,
                    synthetic_size=max(12800, args.batch * world * (args.block_steps + 2) * 2))
    trainer = Trainer(cfg, rank, world, device, publisher.emit, probes["off"])
    agent = ControlAgent(rank, world, BENCH_KEYS, connect, publisher.emit, trainer.check, first)
    criterion = torch.nn.CrossEntropyLoss()
    lines, segments = [], {}  # segment → (case, mode): one trainer, so segment numbers are unique
    for strategy, async_op in CASES:
        case = f"{strategy}{' async' if async_op else ''}"
        if case not in args.cases:
            continue
        sync = first.replace(strategy=strategy, async_op=async_op)
        times = {m: [] for m in MODES}
        cpu = {m: [] for m in MODES}  # this rank's process CPU per step, every thread (publisher, agent, sampler)
        for block in range(args.blocks * len(MODES)):
            mode = MODES[block % len(MODES)]
            trainer.probe = probes[mode]
            trainer.start_segment(Decision(0, sync, f"benchmark {mode}"), agent if mode != "plain" else None)
            segments[trainer.segment] = (case, mode)
            forward = trainer.forward_module  # plain DDP: the wrapper without the comm hook (the probe is off)
            plain_iter = cycle(trainer.loader)
            sampler = (SystemSampler(rank, "bench", "lo", publisher.emit, gpu_indices=[0] if cuda else None)
                       if mode == "all" else None)
            if sampler:
                sampler.start()
            dist.barrier()
            for i in range(args.block_steps + 2):  # the first iteration of a block (a new DDP) is not timed
                if i == 1:
                    settle()
                    t0, c0 = time.perf_counter(), time.process_time()
                if mode == "plain":
                    plain_iteration(trainer, forward, plain_iter, criterion, strategy, async_op)
                    trainer.step += 1
                else:
                    ddptop_iteration(trainer, agent, criterion)
                if i == args.block_steps:
                    cpu[mode].append((time.process_time() - c0) / args.block_steps)  # before settle()'s wait
                    settle()
                    times[mode].append((time.perf_counter() - t0) / args.block_steps)
            trainer.probe.close()
            if sampler:
                sampler.stop()
        med = {m: statistics.median(times[m]) for m in MODES}
        cpu_med = {m: statistics.median(cpu[m]) for m in MODES}
        front = _front_blocks(trainer, agent, criterion, probes, sync, segments, case, strategy, async_op, args, rank,
                              world, front_pid, front_mark, publisher)
        lines.append(f"{case}|{med['plain']}|{med['off']}|{med['all']}|{cpu_med['plain']}|{cpu_med['off']}|"
                     f"{cpu_med['all']}|{front['plain']}|{front['off']}|{front['all']}")
    agent.close()
    publisher.close()
    if rank == 0:
        with open(out_path, "w") as f:
            json.dump({"lines": lines, "segments": segments}, f)
    dist.destroy_process_group()


MARK = "benchmark: the front block ends here, mark "


def _front_blocks(trainer, agent, criterion, probes, sync, segments, case, strategy, async_op, args, rank, world,
                  front_pid, front_mark, publisher) -> dict:
    """The front's CPU per step in each mode (median of --front-rounds blocks of --front-steps steps): read from the
    kernel for the front's process (this benchmark's parent: the real pipeline, its state, derived events and
    recording) before a block and once the front has recorded every rank's last event of it (a marker each rank
    sends after the block: each mode waits for the same trip through the pipeline). Long blocks, because the front
    handles a rank's steps a publisher batch (0.25 s) later: in 30-step blocks its work would fall in the next mode's."""
    front = {m: [] for m in MODES}
    if args.front_rounds <= 0:
        return {m: 0.0 for m in MODES}

    def marked() -> None:  # every rank's marker sent; rank 0 waits until the front has recorded them all
        agent_mark = front_mark.value + 1 if rank == 0 else 0
        dist.barrier()
        mark = agent_mark if world == 1 else _broadcast_int(agent_mark)
        publisher.emit(LogLine(rank, "info", f"{MARK}{mark}", time.time()))
        publisher.flush()
        if rank == 0:
            deadline = time.monotonic() + 120
            while front_mark.value < mark:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the front did not record mark {mark} in 120 s")
                time.sleep(0.01)
        dist.barrier()

    for block in range(args.front_rounds * len(MODES)):
        mode = MODES[block % len(MODES)]
        trainer.probe = probes[mode]
        trainer.start_segment(Decision(0, sync, f"benchmark front {mode}"), agent if mode != "plain" else None)
        segments[trainer.segment] = (case, f"front {mode}")
        forward, plain_iter = trainer.forward_module, cycle(trainer.loader)
        marked()  # what came before is recorded
        f0 = process_cpu_ns(front_pid) if rank == 0 else 0
        for _ in range(args.front_steps):
            if mode == "plain":
                plain_iteration(trainer, forward, plain_iter, criterion, strategy, async_op)
                trainer.step += 1
            else:
                ddptop_iteration(trainer, agent, criterion)
        trainer.probe.close()
        marked()
        if rank == 0:
            front[mode].append((process_cpu_ns(front_pid) - f0) / 1e9 / args.front_steps)
    return {m: statistics.median(front[m]) if front[m] else 0.0 for m in MODES}


def _broadcast_int(value: int) -> int:
    tensor = torch.tensor([value], dtype=torch.int64)
    dist.broadcast(tensor, src=0)
    return int(tensor.item())


def main() -> None:
    ap = parser()
    args = ap.parse_args()
    args.cases = [c.strip() for c in args.cases.split(",")]
    unknown = set(args.cases) - {f"{s}{' async' if a else ''}" for s, a in CASES}
    if unknown:
        ap.error(f"unknown --cases {sorted(unknown)}")
    world = 1 if args.device == "cuda" else args.ranks
    threads = int(os.environ.get("OMP_NUM_THREADS") or max(1, (os.cpu_count() or 1) // world))
    if args.device == "cpu":  # before any thread: the ranks fork from a server forked out of this process, as the CPU
        forks.start()  # ranks of `ddptop run` do (front/forks.py), not two fresh interpreters importing torch again
    hub = Hub("127.0.0.1", BENCH_KEYS, world)  # the front's end of the transport, as in a real job
    method = "spawn" if args.device == "cuda" else "forkserver"
    front_mark = multiprocessing.get_context(method).Value("q", 0)  # the newest marker every rank's front recorded
    events: list = []
    record = tempfile.NamedTemporaryFile(prefix="ddptop-ab-", suffix=".db", delete=False).name
    os.unlink(record)
    writer = RecordingWriter(record, base_meta({}, {}))
    seen = {"events": 0, "marks": {}}  # events handed to the recording; rank → its newest marker among them

    class Counter:  # a sink after the recording's: what it has seen, for the ranks' front blocks
        def handle(self, batch: list) -> None:
            events.extend(batch)
            for e in batch:
                if type(e) is LogLine and e.message.startswith(MARK):
                    seen["marks"][e.rank] = int(e.message[len(MARK):])
            seen["events"] += len(batch)

    # the front's pipeline as a live job's (front.pipeline.compose): its state, derived events and the recording
    feed = compose(hub.source, world_size=world, sinks=[writer, Counter()], front_cost=True).start()
    done = threading.Event()

    def report():  # the newest marker of every rank, once the recording has committed every event seen
        while not done.wait(0.05):
            count, marks = seen["events"], dict(seen["marks"])
            if writer.written >= count and len(marks) == world:
                front_mark.value = min(marks.values())

    thread = threading.Thread(target=report, daemon=True)
    thread.start()
    out = f"/tmp/ddptop-ab-{os.getpid()}.txt"
    mp.start_processes(_rank, args=(world, stores.free_port(), hub.endpoints(), args, out, os.getpid(), front_mark),
                       nprocs=world, start_method=method)
    if args.device == "cpu":
        forkserver._forkserver._stop()  # the server ends here, waited for (its CPU is this process's children's)
    time.sleep(0.5)
    feed.stop()
    done.set()
    thread.join()
    writer.close()
    os.unlink(record)
    hub.close()
    with open(out) as f:
        result = json.load(f)
    os.unlink(out)
    own = _own_costs(events, result["segments"])
    ranks = "1 rank on cuda:0 (nccl)" if args.device == "cuda" else f"{world} local gloo rank{'s' * (world > 1)}"
    print(f"{args.model}, batch {args.batch}/rank, {ranks}, {threads} thread{'s' * (threads > 1)} each, {os.cpu_count()} cores; modes interleaved in "
          f"blocks of {args.block_steps} steps, {args.blocks} blocks each; median s/step of whole loop iterations; "
          f"ddptop's own cost: median own_s of the published steps, every rank; CPU: rank 0's process CPU per step "
          f"(time.process_time, all its threads), median of its blocks\n")
    print("| strategy | plain torch | ddptop --probes off | ddptop --probes all | off / plain | all / plain | all / off "
          "| ddptop's own cost, off | ddptop's own cost, all | CPU ms/step plain, off, all | CPU off / plain "
          "| CPU all / plain |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    wholes = []
    for line in result["lines"]:
        name, plain, off, on, cpu_plain, cpu_off, cpu_all, f_plain, f_off, f_all = line.split("|")
        fp, fo, fa = float(f_plain), float(f_off), float(f_all)
        p, o, a = float(plain), float(off), float(on)
        cp, co, ca = float(cpu_plain), float(cpu_off), float(cpu_all)
        cost = {m: own.get((name, m), 0.0) for m in ("off", "all")}
        print(f"| {name} | {p:.3f} | {o:.3f} | {a:.3f} | {o / p:.3f}× | {a / p:.3f}× | {a / o:.3f}× "
              f"| {cost['off'] * 1e6:.0f} µs ({cost['off'] / o:.3%}) | {cost['all'] * 1e6:.0f} µs ({cost['all'] / a:.3%}) "
              f"| {cp * 1e3:.2f}, {co * 1e3:.2f}, {ca * 1e3:.2f} | {co / cp:.3f}× | {ca / cp:.3f}× |")
        wholes.append(f"| {name} | {fp * 1e3:.3f}, {fo * 1e3:.3f}, {fa * 1e3:.3f} | {(co + fo) / (cp + fp):.3f}× "
                      f"| {(ca + fa) / (cp + fp):.3f}× |")
    if args.front_rounds > 0:
        print(f"\nThe whole CPU per step: rank 0's process (above) and the front's, every thread, from the kernel "
              f"(median of {args.front_rounds} blocks of {args.front_steps} steps per mode, each read once the front "
              f"had recorded the block; the front is this process: the job's pipeline, its state and a recording)\n")
        print("| strategy | front CPU ms/step plain, off, all | whole CPU off / plain | whole CPU all / plain |")
        print("|---|---|---|---|")
        print("\n".join(wholes))


def _own_costs(events, segments: dict) -> dict:
    """(case, mode) → median own_s of the steps the ranks published in that mode's segments (after each block's
    untimed first step)."""
    first: dict = {}
    values: dict = {}
    for e in events:
        if isinstance(e, StepDone):
            case, mode = segments.get(str(e.segment), ("?", "plain"))
            if mode == "plain" or e.step == first.setdefault((e.rank, e.segment), e.step):
                continue
            values.setdefault((case, mode), []).append(e.own_s)
    return {k: statistics.median(v) for k, v in values.items() if v}


if __name__ == "__main__":
    main()
