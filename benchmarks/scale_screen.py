"""CPU the screen costs at 256 ranks (issue 45: redrawing at 256 ranks ≤ 10% of a core), and the simulated job it uses.

`simulate()` makes a 256-rank job's events as ddptop's ranks send them (32 nodes of 8 ranks; a StepDone per rank
per step, a SystemSample per rank every 5 steps) with a few ranks made slow for a stretch of steps, under DDP's
rule that every rank waits at the collective for the slowest (the others' exposed communication grows, the slow
rank's busy time does). `record()` writes them through ddptop's own recorder; tests/tui/test_scale.py replays that
file into the app.

The benchmark runs the real app headless (Textual's test driver, 160×48) as a live screen over that job, which
goes on stepping 10 steps/s on all 256 ranks, and measures the process's CPU (time.process_time: the kernel's
count) with the Ranks panel shown, then the Network panel, then the Controls panel, which draws nothing from the
ranks; and, apart, the app thread's CPU inside the shown panel's render_lines (time.thread_time): what drawing it
costs, of which the whole process's figure (the feed reducing 2,560 steps/s and a snapshot per tick) is the rest.

    .venv/bin/python benchmarks/scale_screen.py [--ranks 256] [--seconds 10]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from ddptop.events import (ConfigApplied, NicStat, RankJoined, RunStarted, StepDone,  # noqa: E402
                           SystemSample)

PER_NODE = 8
SLOW = {37: 2.2, 150: 1.6, 201: 2.5}  # rank → factor on its busy time from SLOW_FROM on
SLOW_FROM = 70
T0 = 1_700_000_000.0
CONFIG = {"strategy": "ddp", "bucket_mb": 25.0, "async_op": False, "batch_size": 64, "lr": 0.1}
BASE_BUSY_S = 0.040
HIDDEN_COMM_S = 0.015  # communication that overlaps compute (not exposed)
SAMPLE_EVERY = 5
GRADIENT_BYTES = 36_924_456  # VGG-11's


def host(rank: int) -> str:
    return f"node{rank // PER_NODE:02d}"


def busy(rank: int, step: int, slow: dict[int, float] = SLOW) -> float:
    """A rank's busy time at a step: 40 ms and up to 2 ms of fixed jitter, times its factor while it is slow."""
    jitter = 0.002 * ((rank * 7 + step * 3) % 5) / 4
    factor = slow.get(rank, 1.0) if step >= SLOW_FROM else 1.0
    return (BASE_BUSY_S + jitter) * factor


def start(ranks: int, t: float = T0) -> list:
    out = [RankJoined(r, ranks, host(r), 1000 + r, "cpu", "gloo", 1, "2.4", "0.1", "simulated", t)
           for r in range(ranks)]
    out.append(RunStarted("vgg11", "cifar10", ranks, "ddp", 25.0, False, 64, 0.1, 9_231_114, 36_924_456, 34, (),
                          196, t, total_steps=0))
    out += [ConfigApplied(r, 0, 0, dict(CONFIG), 0, "start", t) for r in range(ranks)]
    return out


def step_events(ranks: int, step: int, t: float, slow: dict[int, float] = SLOW) -> tuple[list, float]:
    """Every rank's StepDone of one step ending `t` later than the last; DDP: each step lasts the slowest's busy
    time and the communication, so the others' exposed communication is what they waited. (events, the step's end)"""
    busy_s = [busy(r, step, slow) for r in range(ranks)]
    iter_s = max(busy_s) + 0.010
    end = t + iter_s
    out, wire = [], int(2 * (ranks - 1) / ranks * GRADIENT_BYTES)  # ring all-reduce, each way
    for r in range(ranks):
        data, own = 0.004, 0.0005
        compute = busy_s[r] - data - own
        exposed = iter_s - busy_s[r]
        out.append(StepDone(r, step, step // 196, 0, end, iter_s, data, compute, exposed + HIDDEN_COMM_S, exposed,
                            HIDDEN_COMM_S / (exposed + HIDDEN_COMM_S), 64, 2.3 - 0.01 * step, GRADIENT_BYTES,
                            wire, wire, False, fwd_s=0.35 * compute, bwd_s=0.55 * compute,
                            opt_s=0.10 * compute, own_s=own))
    if step % SAMPLE_EVERY == 0:
        out += [sample(r, end, step + 1, iter_s, ranks) for r in range(ranks)]
    return out, end


def sample(rank: int, t: float, steps: int, iter_s: float, ranks: int) -> SystemSample:
    """The node's job interface as the ring's formula has it: each of its ranks sends and receives 2(N−1)/N of the
    gradient bytes a step (a node's ranks share its NIC), plus 1% per node number of other traffic."""
    per_step = PER_NODE * 2 * (ranks - 1) / ranks * GRADIENT_BYTES * (1 + 0.01 * (rank // PER_NODE % 4))
    rate, moved = per_step / iter_s, int(per_step * steps)
    nic = NicStat("eth0", rate, rate, moved, moved, moved // 1500, moved // 1500, 0, 0, 0, 0, rate, rate)
    return SystemSample(rank, host(rank), t, 95.0, 80.0, 2 << 30, 30 << 30, 64 << 30, "eth0", (nic,))


def simulate(ranks: int = 256, steps: int = 120, slow: dict[int, float] = SLOW) -> list:
    """The job's events, in time order."""
    events, t = start(ranks), T0
    for step in range(steps):
        more, t = step_events(ranks, step, t, slow)
        events += more
    return events


def record(path: str, events: list) -> str:
    """The events written by ddptop's recorder (the rows' times are the events' own)."""
    from ddptop.record.sqlite import RecordingWriter, base_meta

    ranks = sum(isinstance(e, RankJoined) for e in events)
    writer = RecordingWriter(path, base_meta({"model": "vgg11", "sync": CONFIG},
                                             {"source": "simulated", "world_size": ranks}), clock="events")
    for i in range(0, len(events), 2000):
        writer.handle(events[i:i + 2000])
    writer.close()
    if writer.error:
        raise SystemExit(writer.error)
    return path


class GoingOn:
    """The simulated job stepping on at `rate` steps/s from where `simulate` left it (a live source)."""

    def __init__(self, ranks: int, steps: int, rate: float = 10.0):
        self.pending = simulate(ranks, steps)
        self.ranks, self.step, self.rate = ranks, steps, rate
        self.t = max(getattr(e, "t", T0) for e in self.pending)
        self.wall = time.monotonic()

    def poll(self) -> list:
        out, self.pending = self.pending, []
        while self.wall + 1 / self.rate <= time.monotonic():
            more, self.t = step_events(self.ranks, self.step, self.t)
            out += more
            self.step += 1
            self.wall += 1 / self.rate
        return out

    def close(self) -> None:
        pass


async def measure(ranks: int, seconds: float, panels: tuple[str, ...]) -> dict[str, tuple[float, float, int]]:
    """panel → (% of a core the whole process used with it shown, % of a core the panel's drawing used, redraws).
    The drawing: the app thread's CPU (time.thread_time) inside the panel's render_lines, where Textual builds its
    lines (render() and Rich's layout of it) when the panel has a new snapshot."""
    from ddptop.front.pipeline import compose
    from ddptop.tui.app import DdptopApp

    feed = compose(GoingOn(ranks, 120)).start()
    app = DdptopApp(feed, mode="live")
    out = {}
    try:
        async with app.run_test(size=(160, 48)) as pilot:
            await pilot.pause(2.0)  # the first snapshot of the 120 steps, the first draw
            for panel in panels:
                app.action_panel(panel)
                await pilot.pause(1.0)
                widget = app.query_one(f"#{panel}-panel")
                spent, drawn, lines = [0.0], [0], widget.render_lines

                def timed(crop, lines=lines, spent=spent, drawn=drawn):
                    t = time.thread_time()
                    try:
                        return lines(crop)
                    finally:
                        spent[0] += time.thread_time() - t
                        drawn[0] += 1

                widget.render_lines = timed
                cpu, wall = time.process_time(), time.monotonic()
                await pilot.pause(seconds)
                elapsed = time.monotonic() - wall
                out[panel] = (100 * (time.process_time() - cpu) / elapsed, 100 * spent[0] / elapsed, drawn[0])
                widget.render_lines = lines
            await pilot.press("q")
    finally:
        feed.stop()
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", type=int, default=256)
    p.add_argument("--seconds", type=float, default=10.0, help="measured time per panel")
    p.add_argument("--record", help="also write the simulated job's first 120 steps to this recording")
    args = p.parse_args()
    if args.record:
        record(args.record, simulate(args.ranks))
        print(f"recorded {args.ranks} ranks x 120 steps to {args.record}")
    with tempfile.TemporaryDirectory():
        result = asyncio.run(measure(args.ranks, args.seconds, ("ranks", "network", "controls")))
    print(f"{args.ranks} ranks stepping 10 steps/s, 160x48, {args.seconds:g} s per panel; % of one core")
    print("| panel shown | drawing it (thread CPU) | ms a redraw | the whole process (process_time) |")
    print("|---|---|---|---|")
    for panel, (whole, drawing, drawn) in result.items():
        each = 10 * drawing * args.seconds / drawn if drawn else 0.0
        print(f"| {panel} | {drawing:.1f} | {each:.1f} | {whole:.1f} |")
    from ddptop.tui.app import PANEL_EVERY_S

    whole, drawing, drawn = result["ranks"]
    each = 10 * drawing * args.seconds / drawn if drawn else 0.0
    print(f"drawing the Ranks panel at {args.ranks} ranks: {each:.1f} ms of CPU a redraw; at its "
          f"{1 / PANEL_EVERY_S['ranks']:g} redraws a second, {each / 10 / PANEL_EVERY_S['ranks']:.1f}% of a core")


if __name__ == "__main__":
    main()
