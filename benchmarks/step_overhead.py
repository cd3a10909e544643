"""Step time of ddptop vs a plain torch script (issue 2: ≤1.02×) and `--probes all` vs `--probes off` (issue 3: ≤1.01×).

VGG-11, batch 64 per rank, 2 local gloo ranks (`--ranks`), each strategy; all measured in this one run, interleaved,
on the same machine. Both sides time the whole loop: ddptop's step time runs from one step boundary to the next
(the control exchange, the probes and handing events to the publisher included) and the plain script's from
one loop top to the next. Prints a markdown table (medians of the measured steps, warm-up steps dropped).

Both sides' ranks start as `ddptop run --local N` starts CPU ranks (cli/run.py): this process sets OMP_NUM_THREADS to
the ranks' thread count before torch loads, and each run's ranks fork from a server forked out of it (front/forks.py),
so no rank imports torch again (spawned interpreters for the plain ranks and a fresh server per ddptop run were ~20
of the smallest 2-rank run's ~40 CPU-s here).

    .venv/bin/python benchmarks/step_overhead.py [--steps 12] [--warmup 2] [--model vgg11] [--rounds 1] \
        [--cases single,ddp] [--ranks 2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

CASES = [("single", False), ("gather-scatter", False), ("allreduce", False), ("allreduce", True), ("ddp", False)]


def ddptop_step_times(strategy, async_op, probes, model, batch, steps, world=2):
    from ddptop.config import RunConfig, SyncConfig
    from ddptop.events import StepDone
    from ddptop.front import forks
    from ddptop.front.supervisor import run_front
    from ddptop.rendezvous import Rendezvous
    from ddptop.train.worker import WorkerOptions

    forks.start()  # the ranks' server, forked from this process (run_front kills it at the run's end)
    cfg = RunConfig(model=model, sync=SyncConfig(strategy=strategy, async_op=async_op, batch_size=batch),
                    steps=steps, probes=probes, eval=False, synthetic_size=max(12800, batch * world * steps))
    done: list[StepDone] = []

    def consumer(feed, job):  # run_front hands a Feed (the front's pipeline): pump it until the ranks exit
        while job.alive():
            feed.pump()
            time.sleep(0.2)
        feed.stop()  # closes the source and hands the last events to the sink below

    class Steps:
        def handle(self, events):
            done.extend(e for e in events if isinstance(e, StepDone) and e.rank == 0)

    code = run_front(cfg, Rendezvous("127.0.0.1", 0, 0, world, 0, world, "local"), WorkerOptions(), consumer,
                     sinks=[Steps()])
    if code != 0:
        raise SystemExit(f"ddptop run failed with exit code {code}")
    return [d.iter_s for d in sorted(done, key=lambda d: d.step)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--model", default="vgg11")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--ranks", type=int, default=2, help="local gloo ranks per run (1: every strategy's one-rank path)")
    ap.add_argument("--cases", default=",".join(f"{s}{' async' if a else ''}" for s, a in CASES),
                    help="comma-separated strategies to measure (default: all five)")
    args = ap.parse_args()
    if args.ranks < 1:
        ap.error("--ranks must be at least 1")
    # as `ddptop run` (cli/run.py): the ranks' thread count before torch loads, so that every thread of a forked rank
    # (gloo's too) computes with it, on both sides alike
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // args.ranks)))
    from plain_torch import step_times as plain_step_times

    from ddptop.front import forks

    names = {f"{s}{' async' if a else ''}": (s, a) for s, a in CASES}
    unknown = sorted(set(args.cases.split(",")) - set(names))
    if unknown:
        ap.error(f"unknown --cases {unknown}")
    med = lambda xs: statistics.median(xs[args.warmup:])  # noqa: E731
    print(f"{args.model}, batch {args.batch}/rank, {args.ranks} local gloo rank(s), {os.cpu_count()} cores, "
          f"{args.steps - args.warmup} measured steps x {args.rounds} round(s), median s/step\n")
    print("| strategy | plain torch | ddptop --probes off | ddptop --probes all | all / plain | all / off |")
    print("|---|---|---|---|---|---|")
    for strategy, async_op in (names[c] for c in args.cases.split(",")):
        plain, off, on = [], [], []
        for _ in range(args.rounds):  # interleaved, so drift in machine load hits all three alike
            forks.start()  # the plain ranks fork from a server forked out of this process, as ddptop's do
            plain.append(med(plain_step_times(strategy, async_op, args.model, args.batch, args.steps, args.ranks,
                                              start_method="forkserver")))
            off.append(med(ddptop_step_times(strategy, async_op, "off", args.model, args.batch, args.steps,
                                             args.ranks)))
            on.append(med(ddptop_step_times(strategy, async_op, "all", args.model, args.batch, args.steps,
                                            args.ranks)))
        p, o, a = statistics.median(plain), statistics.median(off), statistics.median(on)
        name = strategy + (" async" if async_op else "")
        print(f"| {name} | {p:.3f} | {o:.3f} | {a:.3f} | {a / p:.3f}× | {a / o:.3f}× |", flush=True)


if __name__ == "__main__":
    main()
