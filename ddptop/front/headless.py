"""Provides the headless printer and consumer: progress lines (or a rich bar on a TTY), test-set results, per-step profile lines."""

from __future__ import annotations

import contextlib
import os
import sys
import time
from typing import TextIO

from ddptop import metrics
from ddptop.metrics import tables
from ddptop.events import (EpochDone, Event, EventsRefused, RankBack, RankJoined, RankLost, RunFinished, RunStarted, StepDone,
                           TelemetryGap)
from ddptop.errors import OutputClosed
from ddptop.front.feed import Feed, SharedState
from ddptop.metrics import Figures
from ddptop.safe import clean_lines
from ddptop.state.notices import notice
from ddptop.state.snapshot import Snapshot
from ddptop.metrics.traffic import not_comparable

MB = 1e6
LAST_WORDS_S = 3.0  # after the local ranks exited: each one that exited 0 sent its RunFinished; this long for it to
# be read (the rank hands its last batch to the kernel and leaves; a loaded front reads it a moment later)


def progress_line(step: int, total: int, loss: float, recent: Figures, job: Figures, ranks: int, segment: int,
                  unit: str = "img/s") -> str:
    """`step 20/196 loss 2.3100 (rank 0) | job: 0.650 s/it 197 img/s (segment 1, 2 ranks) | rank 0: comm …`.

    Every figure is over the steps since the last line within ONE segment (a window never spans a switch) and says
    whose it is: the job's step time is the slowest rank's and its img/s every rank's images over the slowest
    rank's time, as in the segment table (ddptop.metrics); comm, overlap and bytes (with --probes all) are rank 0's."""
    line = (f"step {step}{f'/{total}' if total else ''} loss {loss:.4f} (rank 0) | job: {job.step_s:.3f} s/it "
            f"{job.images_per_s:.0f} {unit}{f' {job.tokens_per_s:.0f} tokens/s' if job.tokens_per_s > 0 else ''} "
            f"(segment {segment}, {ranks} rank{'s' if ranks != 1 else ''})")
    if recent.comm_s > 0 or recent.tx_bytes > 0:
        line += (f" | rank 0: comm {recent.share(recent.comm_s):.0%} overlap {recent.overlap:.0%} exposed "
                 f"{recent.exposed_comm_s * 1e3:.0f} ms sent {recent.tx_bytes / MB:.1f} MB/step")
    if recent.own_s > 0:
        line += f" | ddptop {recent.own_s * 1e3:.2f} ms ({recent.share(recent.own_s):.2%}, rank 0)"
        if recent.threads_s > 0:  # its other threads' CPU per step (issue 42): beside the training thread's time
            line = line[:-1] + f"; +{recent.threads_s * 1e3:.2f} ms CPU on its threads)"
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
    """Writes what a user watching a log wants to see. Its numbers come from the front's SessionState (the same
    reducer the screen reads); it listens to that state, so each batch is applied before it is printed."""

    def __init__(self, total_steps: int = 0, every: int = 10, out: TextIO | None = None, bar: bool | None = None,
                 state: SharedState | None = None):
        self.total = total_steps
        self.unit = "img/s"  # metrics.rate_unit of the run's data set, once RunStarted names it
        self.every = max(1, every)
        self.out = out or sys.stdout
        self.finished: dict[int, RunFinished] = {}
        self.lost: dict[int, RankLost] = {}
        self.gaps: list[TelemetryGap] = []
        self.bar = ProgressBar(self.out) if (self.out.isatty() if bar is None else bar) else None
        self.state = state or SharedState()
        self.loss_said = False  # the state's loss flag (metrics.learning) is printed once
        self.gone = False  # the output's reader went away (a closed pipe): nothing more is printed
        # the first step's line waits until every rank has been heard from: a slower rank's batch brings its
        # "joined" after rank 0's first step (issue 44: "rank 1 joined" printed after step 1)
        self.world = 0  # from the first RankJoined (0: unknown, as for an attach that missed the joins)
        self.heard: set[int] = set()
        self.held: list[str] = []
        self.state.listeners.append(self._lines)

    def handle(self, events: list[Event]) -> None:
        """Standalone use (tests, a recording read at once): apply to the state, which calls back `_lines`."""
        self.state.handle(events)

    def _lines(self, events: list[Event]) -> None:
        for event in events:
            if isinstance(event, (StepDone, RankJoined, RankLost, RunFinished)):
                self._heard(event)
            if isinstance(event, StepDone):
                self._step(event)
            elif isinstance(event, EpochDone):
                self._print(evaluation_line(event))
            elif isinstance(event, RankJoined):
                self._print(f"rank {event.rank} joined from {event.host} pid {event.pid} ({event.device}, "
                            f"{event.backend}, {event.threads} threads, ranks found by {event.rank_source})")
                self._release()
            elif isinstance(event, RunStarted):
                self.total = event.total_steps or self.total  # the trainer's own count
                # 0 steps per epoch: unknown (a user's own loop, whose loader is its own)
                per_epoch = f", {event.steps_per_epoch} steps/epoch" if event.steps_per_epoch else ""
                self.unit = metrics.rate_unit(event.dataset)
                self._print(f"training {event.model} ({event.param_count / 1e6:.2f}M parameters in "
                            f"{event.param_tensors} tensors, {event.param_bytes / MB:.1f} MB of gradients) on "
                            f"{event.dataset}, {event.world_size} ranks, {event.strategy}, batch {event.batch_size}"
                            f"/rank{per_epoch}")
            elif isinstance(event, RunFinished):
                self.finished[event.rank] = event
            else:
                self._other(event)

    def _other(self, event: Event) -> None:
        if isinstance(event, RankLost):
            self.lost[event.rank] = event
        elif isinstance(event, RankBack):
            self.lost.pop(event.rank, None)
        elif isinstance(event, TelemetryGap):
            self.gaps.append(event)
        elif isinstance(event, EventsRefused) and self.state.state.refused != event.count:
            return  # said at the first refusal; the closing lines count them all
        view = self.state.state.ranks.get(event.rank) if isinstance(event, RankLost) else None
        text = notice(event, view.step if view is not None and view.last is not None else None)
        if text:
            self._print(text)

    def _step(self, done: StepDone) -> None:
        step = done.step + 1
        state = self.state.state  # called under the state's lock, right after this batch was applied
        if state.loss_flag is not None and not self.loss_said:
            self.loss_said = True
            self._print(f"WARNING: {state.loss_flag}")
        if done.rank != 0:
            return
        line_due = step % self.every == 0 or step == self.total or step == 1
        if self.bar is None and not line_due:
            return
        n = min(self.every, step)
        windows = {r: state.window(r, done.step, n, segment=done.segment) for r in state.history
                   if state.rank_state(r) != "lost"}
        job = metrics.job_figures(windows.values())
        mine = windows.get(0, metrics.Figures())
        if self.bar is not None:
            self.bar.update(step, self.total, f"loss {done.loss:.3f}  job {job.step_s:.3f} s/it  "
                                              f"{job.images_per_s:.0f} {self.unit}")
        if line_due:
            line = progress_line(step, self.total, done.loss, mine, job, len(windows), done.segment, self.unit)
            if step == 1 and self._waiting():
                self.held.append(line)
            else:
                self._release()
                self._print(line)

    def _heard(self, event: Event) -> None:
        if isinstance(event, RankJoined) and not self.world:
            self.world = event.world_size
        if not isinstance(event, RankJoined):  # a step, loss or end before its join: nothing more to wait for
            self.heard.add(event.rank)

    def _waiting(self) -> bool:
        """Some rank of the job has not been heard from yet (its join line would come after the first step's)."""
        joined = {r for r in self.state.state.ranks} if self.world else set()
        return bool(self.world) and len(joined | self.heard) < self.world

    def _release(self) -> None:
        if self.held and not self._waiting():
            held, self.held = self.held, []
            for line in held:
                self._print(line)

    def _print(self, line: str) -> None:
        if self.gone:
            return
        line = clean_lines(line)  # events were cleaned when decoded; printed lines are cleaned again all the same
        try:
            if self.bar is not None:
                self.bar.print(line)
            else:
                print(line, file=self.out, flush=True)
        except BrokenPipeError:
            self._reader_gone()

    def _reader_gone(self) -> None:
        """`ddptop … | head`: the consumer stops the job (OutputClosed); what is still printed goes nowhere, so
        neither a later line nor the exit-time flush raises again."""
        self.gone = True
        if self.out is sys.stdout:
            with contextlib.suppress(OSError, ValueError):
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())

    def finish(self, traffic: bool) -> None:
        """The closing lines once ranks have finished (NIC vs formulas when `traffic`), then the bar goes."""
        held, self.held = self.held, []  # a rank never heard from: the first step's line all the same
        for line in held:
            self._print(line)
        snap = self.state.snapshot()
        if self.finished:
            segments = snap.segment_figures
            if segments and any(s.measured_steps for s in segments):
                for line in ["segments:", *tables.lines(segments, indent="  ", unit=self.unit)]:
                    self._print(line)
            for line in traffic_lines(snap) if traffic else []:
                self._print(line)
            self._print(self.summary())
        refused = self.state.state.refused
        if refused:
            self._print(f"refused {refused} event{'s' if refused > 1 else ''} from the ranks in all "
                        "(a field of the wrong type or range, or another rank's): they are in neither screen nor "
                        "recording")
        if self.bar is not None:
            self.bar.stop()

    def summary(self) -> str:
        steps = max((f.steps for f in self.finished.values()), default=0)
        reasons = sorted({f.reason for f in self.finished.values()}) or ["no rank finished"]
        return f"finished: {steps} steps on {len(self.finished)} ranks ({', '.join(reasons)})"


def traffic_lines(snap: Snapshot) -> list[str]:
    """Per rank: bytes the NIC counted against the ring/gather formulas over the last minutes (ranks that sent
    nothing skipped); a shared counter (lo, or one that moves more than the job explains) is refused."""
    out, refused = [], {}
    for rank in sorted(snap.history):
        t = snap.traffic(rank)
        if t is None or t.expected_tx == 0:
            continue
        why = not_comparable(t.iface, t.nic_tx, t.expected_tx, t.steps)
        if why:
            refused.setdefault(why, []).append(rank)
            continue
        out.append(t.describe())
    for why, ranks in refused.items():
        out.append(f"no NIC comparison for rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}: {why}"
                   + (" (docs/how-to/lab.md: a cluster on one machine)" if "shared by every process" in why else ""))
    return out


class HeadlessConsumer:
    """Watches a live job without a screen: the feed (its own thread) prints and records until every local rank
    has exited. When the user interrupts, the front stops the ranks and then calls `finish`, so the last steps,
    the closing lines and the recording's end still come."""

    def __init__(self, printer: HeadlessPrinter, poll_s: float = 0.2):
        self.printer = printer
        self.poll_s = poll_s

    def __call__(self, feed: Feed, job) -> None:
        """Until the ranks exit; OutputClosed when the output's reader went away, which the front turns into a
        stop of the whole job, as a Ctrl-C (front.supervisor._watch)."""
        feed.start()
        while job.alive():
            if self.printer.gone:
                raise OutputClosed("the output's reader went away (a closed pipe)")
            time.sleep(self.poll_s)
        self._last_words(job)
        self.finish(feed, job)

    def _last_words(self, job) -> None:
        """Until every local rank that exited 0 has been heard finish, at most LAST_WORDS_S: a CI run beside two busy
        loops lost rank 0's RunFinished from the recording when the feed was drained the moment the ranks had
        exited. A job this front did not start (attach) has no exit codes: nothing to wait for."""
        codes = getattr(job, "codes", None)
        if codes is None:
            return
        expected = [rank for rank, code in zip(job.ranks, codes()) if code == 0]
        deadline = time.monotonic() + LAST_WORDS_S
        while any(rank not in self.printer.finished for rank in expected) and time.monotonic() < deadline:
            time.sleep(0.02)

    def finish(self, feed: Feed, job) -> None:
        feed.stop()
        self.printer.finish(traffic=True)
