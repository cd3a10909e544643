"""ddptop's whole CPU cost per step against a plain torch loop, as the kernel counts it (issue 42).

Wall time cannot resolve a 5% cost on a shared 2-core machine (load 4-6: runs differ by ±10-20%), and ddptop's
own `own_s` sees only the training thread. Here each mode runs as a whole process tree (for ddptop: the front,
its collector and recorder, the rank with its publisher, sampler and control threads) at two step counts, and the
kernel's CPU accounting of that tree (getrusage(RUSAGE_CHILDREN): user + system of every waited-for descendant)
is read around it. The difference divided by the extra steps is the CPU per step: start-up, data set generation,
imports and shutdown cancel. Modes alternate inside each round, so drift in the machine's load hits all alike.

- plain: this file's own loop (`--child`): the same model, data, loader and optimizer as ddptop builds, one
         thread, `loss.item()` every step;
- off:   `ddptop --local 1 --strategy single --probes off --headless`, recorded to a temporary file;
- all:   the same with `--probes all`.

    .venv/bin/python benchmarks/cpu_per_step.py [--rounds 3] [--steps 150,750] [--model tiny] [--batch 2]

Prints the CPU ms per step of each mode (median over rounds) and off / plain, all / plain.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODES = ("plain", "off", "all")
ONE_THREAD = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def plain_child(model_name: str, batch: int, steps: int, size: int, lr: float) -> None:
    """The plain loop: what a researcher's script does for one step, nothing else."""
    sys.path.insert(0, ROOT)
    import torch

    from ddptop.config import RunConfig, SyncConfig
    from ddptop.train.data import build_datasets, make_loader
    from ddptop.train.models import build_model

    torch.set_num_threads(1)
    torch.manual_seed(0)
    cfg = RunConfig(model=model_name, sync=SyncConfig(strategy="single", batch_size=batch), synthetic_size=size)
    model = build_model(model_name)
    train_set, _ = build_datasets(cfg)
    loader, sampler = make_loader(train_set, batch, 0, 1, 0, train=True)
    sampler.set_epoch(0)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, weight_decay=1e-4)
    criterion = torch.nn.CrossEntropyLoss()
    iterator = iter(loader)
    for _ in range(steps):
        inputs, labels = next(iterator)
        opt.zero_grad(set_to_none=True)
        loss = criterion(model(inputs), labels)
        loss.backward()
        opt.step()
        loss.item()


def command(mode: str, args, steps: int, record: str) -> list[str]:
    if mode == "plain":
        return [sys.executable, os.path.abspath(__file__), "--child", "--model", args.model, "--batch",
                str(args.batch), "--size", str(args.size), "--lr", str(args.lr), "--run-steps", str(steps)]
    return [sys.executable, "-m", "ddptop", "run", "--local", "1", "--strategy", "single", "--model", args.model,
            "--batch-size", str(args.batch), "--steps", str(steps), "--synthetic-size", str(args.size),
            "--lr", str(args.lr), "--threads", "1", "--no-eval", "--headless", "--log-every", "100000",
            "--probes", mode, "--record", record]


def cpu_of(cmd: list[str]) -> float:
    """User + system CPU seconds of the whole process tree `cmd` starts (every descendant it waited for)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(cmd, cwd=ROOT, env={**os.environ, **ONE_THREAD}, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd[:6])}... exited {done.returncode}: {done.stderr.strip()[-400:]}")
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", default="150,750", help="the two step counts, short,long")
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--size", type=int, default=0, help="synthetic set size (default: enough for the long run)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--run-steps", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return plain_child(args.model, args.batch, args.run_steps, args.size, args.lr)
    short, long = (int(x) for x in args.steps.split(","))
    args.size = args.size or args.batch * (long + 10)  # one epoch covers the long run: no epoch boundary inside
    modes = args.modes.split(",")
    per_step: dict[str, list[float]] = {m: [] for m in modes}
    with tempfile.TemporaryDirectory(prefix="ddptop-cpu-") as tmp:
        for r in range(args.rounds):
            for mode in modes:  # interleaved: each round runs every mode at both lengths
                cpu = {}
                for steps in (short, long):
                    cpu[steps] = cpu_of(command(mode, args, steps, os.path.join(tmp, f"{mode}-{r}-{steps}.db")))
                per_step[mode].append((cpu[long] - cpu[short]) / (long - short))
                print(f"round {r + 1} {mode}: {cpu[short]:.2f} s CPU at {short} steps, {cpu[long]:.2f} s at {long}"
                      f" -> {per_step[mode][-1] * 1e3:.3f} ms/step", file=sys.stderr, flush=True)
    med = {m: statistics.median(v) for m, v in per_step.items()}
    print(f"{args.model}, batch {args.batch}, one rank, single, one thread; CPU per step from the kernel "
          f"(steps {short} vs {long}, median of {args.rounds} interleaved rounds)")
    print("| mode | CPU ms/step | / plain |")
    print("|---|---|---|")
    for m in modes:
        ratio = f"{med[m] / med['plain']:.3f}×" if "plain" in med else "-"
        print(f"| {m} | {med[m] * 1e3:.3f} | {ratio} |")


if __name__ == "__main__":
    main()
