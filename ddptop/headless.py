"""The headless consumer: progress lines (or a rich bar on a TTY), test-set results, per-step profile lines."""

from __future__ import annotations

import sys
import time
from collections import defaultdict, deque
from itertools import islice
from typing import TextIO

from ddptop import metrics, tables
from ddptop.events import (ConfigApplied, ControlRefused, EpochDone, Event, LogLine, ModelsDiverged, OutOfMemory,
                           RankJoined, RankLost, RunFinished, RunStarted, RunState, StepDone, SystemSample)
from ddptop.metrics import Figures
from ddptop.traffic import measured_vs_expected

MB = 1e6
HISTORY = 100_000  # step summaries and system samples kept per rank for the closing lines


def progress_line(step: int, total: int, loss: float, recent: Figures, images_per_s: float) -> str:
    """`step 20/196 loss 2.31 0.65 s/it 197 img/s`, then (with --probes all) the step's profile: means over the
    steps since the last line (ddptop.metrics), rank 0's."""
    line = f"step {step}{f'/{total}' if total else ''} loss {loss:.4f} {recent.step_s:.3f} s/it {images_per_s:.0f} img/s"
    if recent.comm_s > 0 or recent.tx_bytes > 0:
        line += (f" | comm {recent.share(recent.comm_s):.0%} overlap {recent.overlap:.0%} exposed "
                 f"{recent.exposed_comm_s * 1e3:.0f} ms sent {recent.tx_bytes / MB:.1f} MB")
    if recent.own_s > 0:
        line += f" | ddptop {recent.own_s * 1e3:.2f} ms ({recent.share(recent.own_s):.2%})"
    return line


class ProgressBar:
    """On a terminal: a rich progress bar under the log lines."""

    def __init__(self, out: TextIO):
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        self.progress = Progress(TextColumn("training"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                                 TextColumn("{task.description}"), console=Console(file=out), transient=True)
        self.task = None

    def update(self, step: int, total: int, text: str) -> None:
        if self.task is None:
            self.progress.start()
            self.task = self.progress.add_task(text, total=total or None)
        self.progress.update(self.task, completed=step, total=total or None, description=text)

    def print(self, line: str) -> None:
        self.progress.console.print(line, markup=False, highlight=False)

    def stop(self) -> None:
        if self.task is not None:
            self.progress.stop()


def evaluation_line(e: EpochDone) -> str:
    """The course's format: `Test set: Average loss: 2.0345, Accuracy: 2292/10000 (23%)`."""
    pct = 100.0 * e.correct / e.total if e.total else 0.0
    return f"Test set: Average loss: {e.test_loss:.4f}, Accuracy: {e.correct}/{e.total} ({pct:.0f}%)"


class HeadlessPrinter:
    """Consumes the event stream and writes what a user watching a log wants to see."""

    def __init__(self, total_steps: int = 0, every: int = 10, out: TextIO | None = None, bar: bool | None = None):
        self.total = total_steps
        self.every = max(1, every)
        self.out = out or sys.stdout
        self.latest: dict[int, StepDone] = {}
        self.finished: dict[int, RunFinished] = {}
        self.lost: dict[int, RankLost] = {}
        # bounded: the NIC-vs-formula lines look at the last hours, not at everything since the start
        self.samples: dict[int, deque[SystemSample]] = defaultdict(lambda: deque(maxlen=HISTORY))
        self.steps: dict[int, deque[StepDone]] = defaultdict(lambda: deque(maxlen=HISTORY))
        self.bar = ProgressBar(self.out) if (self.out.isatty() if bar is None else bar) else None
        self.table = metrics.SegmentTable()

    def handle(self, events: list[Event]) -> None:
        for event in events:
            if isinstance(event, StepDone):
                self.steps[event.rank].append(event)
                self.table.apply(event)
                self._step(event)
            elif isinstance(event, SystemSample):
                self.samples[event.rank].append(event)
            elif isinstance(event, EpochDone):
                self._print(evaluation_line(event))
            elif isinstance(event, RankJoined):
                self._print(f"rank {event.rank} joined from {event.host} pid {event.pid} ({event.device}, "
                            f"{event.backend}, {event.threads} threads, ranks found by {event.rank_source})")
            elif isinstance(event, RunStarted):
                self.total = event.total_steps or self.total  # the trainer's own count
                self.table.warmup = event.warmup
                self._print(f"training {event.model} ({event.param_count / 1e6:.2f}M parameters in "
                            f"{event.param_tensors} tensors, {event.param_bytes / MB:.1f} MB of gradients) on "
                            f"{event.dataset}, {event.world_size} ranks, {event.strategy}, batch {event.batch_size}"
                            f"/rank, {event.steps_per_epoch} steps/epoch")
            elif isinstance(event, RunFinished):
                self.finished[event.rank] = event
            elif isinstance(event, ConfigApplied):
                self.table.apply(event)
                if event.rank == 0 and event.who != "start":
                    synced = (f"; one-off: {event.sync_bytes / MB:.1f} MB broadcast from rank 0"
                              if event.sync_bytes else "")
                    self._print(f"step {event.step}: now {tables.describe(event.config)} "
                                f"(segment {event.segment}, asked by {event.who}; switch took "
                                f"{event.switch_s:.2f} s{synced})")
            elif isinstance(event, OutOfMemory):
                self._print(f"step {event.step}: {event.describe()}")
            elif isinstance(event, ModelsDiverged):
                self._print(f"WARNING: {event.describe()}")
            elif isinstance(event, ControlRefused):
                self._print(f"control request {event.request_id} ignored: {event.reason}")
            elif isinstance(event, RankLost):
                self.lost[event.rank] = event
                last = self.latest[event.rank].step if event.rank in self.latest else event.last_step
                self._print(f"rank {event.rank} lost after step {last}: {event.reason}")
            elif isinstance(event, RunState) and event.rank == 0:
                self._print(f"step {event.step}: {'paused' if event.paused else 'resumed'}")
            elif isinstance(event, LogLine):
                self._print(f"rank {event.rank} {event.level}: {event.message}")

    def _step(self, done: StepDone) -> None:
        self.latest[done.rank] = done
        step = done.step + 1
        if done.rank != 0:
            return
        line_due = step % self.every == 0 or step == self.total or step == 1
        if self.bar is None and not line_due:
            return
        n = min(self.every, step)
        windows = {r: metrics.window(list(islice(reversed(steps), n))[::-1]) for r, steps in self.steps.items() if r not in self.lost}
        images_per_s = metrics.job_images_per_s(windows.values())
        mine = windows.get(0, metrics.Figures())
        if self.bar is not None:
            self.bar.update(step, self.total, f"loss {done.loss:.3f}  {mine.step_s:.3f} s/it  {images_per_s:.0f} img/s")
        if line_due:
            self._print(progress_line(step, self.total, done.loss, mine, images_per_s))

    def _print(self, line: str) -> None:
        if self.bar is not None:
            self.bar.print(line)
        else:
            print(line, file=self.out, flush=True)

    def finish(self, traffic: bool) -> None:
        """The closing lines once ranks have finished (NIC vs formulas when `traffic`), then the bar goes."""
        if self.finished:
            segments = self.table.segments()
            if segments and any(s.measured_steps for s in segments):
                for line in ["segments:", *tables.lines(segments, indent="  ")]:
                    self._print(line)
            for line in self.traffic_lines() if traffic else []:
                self._print(line)
            self._print(self.summary())
        if self.bar is not None:
            self.bar.stop()

    def traffic_lines(self) -> list[str]:
        """Per rank: bytes the NIC counted against the ring/gather formulas (ranks that sent nothing skipped)."""
        out, shared = [], False
        for rank in sorted(self.steps):
            traffic = measured_vs_expected(self.samples.get(rank, []), self.steps[rank])
            if traffic is None or traffic.expected_tx == 0:
                continue
            if traffic.iface in ("lo", "lo0"):
                shared = True  # every local rank (and anything else on the machine) shares the loopback counters
                continue
            out.append(traffic.describe())
        if shared:
            out.append("ranks on one machine talk over lo, whose counters mix every process: "
                       "no per-rank NIC comparison (see README for the namespace cluster)")
        return out

    def summary(self) -> str:
        steps = max((f.steps for f in self.finished.values()), default=0)
        reasons = sorted({f.reason for f in self.finished.values()}) or ["no rank finished"]
        return f"finished: {steps} steps on {len(self.finished)} ranks ({', '.join(reasons)})"


class HeadlessConsumer:
    """Feeds the printer (and every other sink, e.g. a recording) until every local rank has exited.

    When the user interrupts, the front stops the ranks and then calls `finish`, so the last steps and
    the summary are still printed and recorded.
    """

    def __init__(self, printer: HeadlessPrinter, sinks: list | None = None, poll_s: float = 0.2):
        self.printer = printer
        self.sinks = [printer, *(sinks or [])]
        self.poll_s = poll_s

    def _feed(self, events: list[Event]) -> None:
        for sink in self.sinks:
            sink.handle(events)

    def __call__(self, source, job) -> None:
        while job.alive():
            self._feed(source.poll() + job.lost_events())
            job.check()
            time.sleep(self.poll_s)
        self.finish(source, job)

    def finish(self, source, job) -> None:
        source.close()
        self._feed(source.poll() + job.lost_events())
        self.printer.finish(traffic=True)
