"""CPU the live screen costs: the real app in a real terminal (tmux, 160×48), fed events at the rate of N ranks.

A synthetic source stands in for the job (a real 8-rank job would swamp a 2-core machine and measure the
ranks, not the screen): every rank reports a StepDone per step at `--steps-per-s`, a StepSpans with
VGG-11's 80 spans every 10th step, and a SystemSample with 4 interfaces every 0.5 s, which is what
ddptop's ranks send. The app runs each panel for a while; its own process CPU time is measured.

    .venv/bin/python benchmarks/tui_cpu.py --ranks 8 --seconds 60
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from ddptop.front.pipeline import compose
from ddptop.events import ConfigApplied  # noqa: E402
from ddptop.events import (NicStat, RankJoined, RunStarted, Span, StepDone, StepSpans,  # noqa: E402
                           SystemSample)

PANELS = ("overview", "ranks", "network", "util", "timeline", "loss", "controls")
LAYERS = [f"features.{i}" for i in range(0, 29, 1)][:19] + ["classifier.0", "classifier.3", "classifier.6"]


class SyntheticSource:
    """Events of `ranks` ranks at `steps_per_s`, generated from the wall clock as poll() is called."""

    def __init__(self, ranks: int, steps_per_s: float):
        self.ranks, self.rate = ranks, steps_per_s
        self.t0 = time.time()
        self.step = 0
        self.next_sample = self.t0
        self.pending = [RankJoined(r, ranks, f"node{r // 2}", 100 + r, "cpu", "gloo", 1, "2", "0.1", "flags", self.t0)
                        for r in range(ranks)]
        self.pending.append(RunStarted("vgg11", "cifar10", ranks, "ddp", 25.0, False, 64, 0.1, 9_231_114,
                                       36_924_456, 34, (), 196, self.t0))
        self.pending += [ConfigApplied(r, 0, 0, {"strategy": "ddp", "bucket_mb": 25.0, "async_op": False,
                                                 "batch_size": 64, "lr": 0.1}, 0, "start", self.t0)
                         for r in range(ranks)]

    def poll(self) -> list:
        now = time.time()
        out, self.pending = self.pending, []
        while self.t0 + (self.step + 1) / self.rate <= now:
            out += [self._step_done(r, self.step, now) for r in range(self.ranks)]
            if self.step % 10 == 0:
                out += [self._spans(r, self.step, now) for r in range(self.ranks)]
            self.step += 1
        while self.next_sample <= now:
            out += [self._sample(r, self.next_sample) for r in range(self.ranks)]
            self.next_sample += 0.5
        return out

    def close(self) -> None:
        pass

    def _step_done(self, rank: int, step: int, t: float) -> StepDone:
        iter_s = 1 / self.rate * (1 + 0.05 * rank)
        return StepDone(rank, step, step // 196, 0, t, iter_s, 0.01, 0.6 * iter_s, 0.3 * iter_s, 0.1 * iter_s, 0.6,
                        64, 2.3 / (1 + step / 100) + 0.01 * rank, 36_924_456, 64_000_000, 64_000_000, step % 10 == 1,
                        fwd_s=0.2 * iter_s, bwd_s=0.35 * iter_s, opt_s=0.05 * iter_s, own_s=0.002 * iter_s)

    def _spans(self, rank: int, step: int, t: float) -> StepSpans:
        spans, at = [Span("data", "data", 0.0, 0.01)], 0.01
        for kind in ("fwd", "bwd"):
            for name in (LAYERS if kind == "fwd" else LAYERS[::-1]):
                spans.append(Span(kind, name, at, 0.004))
                at += 0.004
        spans += [Span("comm", f"bucket {i}", 0.1 + 0.02 * i, 0.03, 25_000_000, 43_000_000, 43_000_000)
                  for i in range(2)]
        spans.append(Span("opt", "optimizer", at + 0.05, 0.01))
        return StepSpans(rank, step, 0, t - 0.25, tuple(spans))

    def _sample(self, rank: int, t: float) -> SystemSample:
        nics = tuple(NicStat(name, 8e7, 8e7, int(8e7 * (t - self.t0)), int(8e7 * (t - self.t0)), 1000, 1000, 0, 0,
                             0, 0, 9e7, 9e7) for name in ("eth0", "eth1", "ib0", "lo"))
        return SystemSample(rank, f"node{rank // 2}", t, 95.0, 80.0, 2 << 30, 30 << 30, 64 << 30, "eth0", nics)


def child(args: argparse.Namespace) -> None:
    """Runs inside tmux: the app, switching panels, measuring its own CPU time per panel."""
    from ddptop.tui.app import DdptopApp

    feed = compose(SyntheticSource(args.ranks, args.steps_per_s)).start()  # as live: the feed on its own thread
    app = DdptopApp(feed, mode="live")
    per_panel = args.seconds / len(PANELS)
    results: dict[str, float] = {}
    plan = {"i": 0, "cpu": 0.0, "wall": 0.0}

    def next_panel() -> None:
        cpu, wall = time.process_time(), time.monotonic()
        if plan["i"] > 0:
            results[PANELS[plan["i"] - 1]] = 100 * (cpu - plan["cpu"]) / (wall - plan["wall"])
        if plan["i"] == len(PANELS):
            app.exit()
            return
        app.action_panel(PANELS[plan["i"]])
        plan.update(i=plan["i"] + 1, cpu=time.process_time(), wall=time.monotonic())
        app.set_timer(per_panel, next_panel)

    app.call_later(lambda: app.set_timer(args.warmup, next_panel))
    app.run()
    with open(args.out, "w") as fh:
        json.dump(results, fh)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", type=int, default=8)
    p.add_argument("--steps-per-s", type=float, default=10.0)
    p.add_argument("--seconds", type=float, default=60.0, help="measured time, split over the seven panels")
    p.add_argument("--warmup", type=float, default=5.0)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        child(args)
        return
    if shutil.which("tmux") is None:
        raise SystemExit("tmux is needed to give the app a real terminal")
    out = os.path.join(tempfile.mkdtemp(), "cpu.json")
    name = f"ddptop-bench-{os.getpid()}"
    cmd = (f"sleep 1; {sys.executable} {os.path.abspath(__file__)} --child --ranks {args.ranks} --steps-per-s "
           f"{args.steps_per_s} --seconds {args.seconds} --warmup {args.warmup} --out {out}")
    subprocess.run(["tmux", "new-session", "-d", "-s", name, "-x", "160", "-y", "48", cmd], check=True)
    subprocess.run(["tmux", "set-option", "-t", name, "window-size", "manual"], capture_output=True)
    subprocess.run(["tmux", "resize-window", "-t", name, "-x", "160", "-y", "48"], capture_output=True)
    deadline = time.monotonic() + args.seconds + args.warmup + 60
    while not os.path.exists(out) and time.monotonic() < deadline:
        time.sleep(0.5)
    subprocess.run(["tmux", "kill-session", "-t", name], capture_output=True)
    with open(out) as fh:
        results = json.load(fh)
    print(f"app process CPU, % of one core, {args.ranks} ranks at {args.steps_per_s:g} steps/s, 160x48 in tmux:")
    for panel, pct in results.items():
        print(f"  {panel:<10} {pct:5.1f}%")
    print(f"  mean       {sum(results.values()) / len(results):5.1f}%")


if __name__ == "__main__":
    main()
