"""One ddptop job on a lab: node 0's front on the user's terminal, one rank per host, stopped and cleaned up whole.

Node 0 runs `ddptop --master <node 0> --rank 0 ...` (the front: store, collector, screen or headless lines,
--record) exactly as on a cluster; hosts 1..N−1 run `--rank r` in sessions of their own, logging to the lab's
folder. The front gets its own process group and, when the lab owns the terminal, the terminal's foreground:
Ctrl-C and the screen's keys reach it alone, as if it had been typed on node 0. A SIGINT/SIGTERM sent to the lab
process is passed on to the front, which stops every rank at a step boundary and closes the recording.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
import sys
import time

import psutil

from ddptop.control.token import TOKEN_ENV
from ddptop.events import CPUS_ENV, LINK_ENV
from ddptop.lab.cluster import Lab

FRONT_STOP_S = 60.0  # after a stop, the front's own STOP_WAIT_S (20 s) and its closing, then it is killed
WORKER_EXIT_S = 30.0  # after the front ends, the other hosts' ranks get this long to finish and leave
FAILED_WORKER_EXIT_S = 10.0  # a rank whose link is gone cuts its heartbeat and last telemetry after 2 s each
LOST_FRONT_S = 30.0  # every worker gone but the front still runs: it gets this long to notice, then SIGTERM
# A stop reaches the front once it has run this long: before, its interpreter may still be importing `site`, where a
# SIGINT is a fatal error (`Fatal Python error: init_import_site`, exit 1: read as a crash) and not ddptop's stop.
# Starting Python takes ~0.05 s here; the front then imports torch for ~2 s, where a SIGINT is a clean exit 130.
FRONT_START_S = 1.0


class Signals:
    """SIGINT, SIGTERM and SIGHUP to the lab process: noted (and passed on), never a half-torn-down lab."""

    def __init__(self) -> None:
        self.pending: list[int] = []
        self.stopped = False  # a signal reached a job: the user stopped it, so a profile's later runs must not start
        self.skipped: list[str] = []  # the runs of a profile that a stop left unstarted
        self.job_running = False  # True: a job (or the teardown) is under way, so a signal is only noted
        self.previous = {s: signal.signal(s, self._note) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}

    def _note(self, signum, frame) -> None:
        self.pending.append(signum)
        if not self.job_running:  # while the lab is built or torn down: unwind through its `finally`
            raise KeyboardInterrupt

    @contextlib.contextmanager
    def shield(self):
        """No KeyboardInterrupt inside: a lab is torn down whole, however often Ctrl-C is pressed."""
        before, self.job_running = self.job_running, True
        try:
            yield
        finally:
            self.job_running = before

    def take(self) -> list[int]:
        taken, self.pending = self.pending, []
        self.stopped = self.stopped or bool(taken)
        return taken

    def restore(self) -> None:
        for signum, handler in self.previous.items():
            signal.signal(signum, handler)


class Foreground:
    """Hands the terminal to the front's process group while it runs, as a shell does for a foreground job."""

    def __init__(self, pgid: int) -> None:
        self.fd: int | None = None
        try:
            fd = sys.stdin.fileno()
            if os.isatty(fd) and os.tcgetpgrp(fd) == os.getpgrp():
                self._set(fd, pgid)
                self.fd = fd
        except (OSError, ValueError):
            pass

    @staticmethod
    def _set(fd: int, pgid: int) -> None:
        previous = signal.signal(signal.SIGTTOU, signal.SIG_IGN)  # a background group may not take the terminal
        try:
            os.tcsetpgrp(fd, pgid)
        finally:
            signal.signal(signal.SIGTTOU, previous)

    def restore(self) -> None:
        if self.fd is not None:
            try:
                self._set(self.fd, os.getpgrp())
            except OSError:
                pass


def node_argv(run_argv: list[str], lab: Lab, nodes: int, rank: int, record: str | None) -> list[str]:
    argv = [sys.executable, "-m", "ddptop", *run_argv, "--master", lab.addresses[0], "--rank", str(rank),
            "--world-size", str(nodes)]
    if not any(a == "--threads" or a.startswith("--threads=") for a in run_argv):
        argv += ["--threads", str(lab.threads)]
    return argv + (["--record", record] if record and rank == 0 else [])


def run_job(lab: Lab, nodes: int, run_argv: list[str], record: str | None, signals: Signals) -> int:
    """Run one job on hosts 0..nodes−1 to its end; its exit code (the front's, else the first failed host's)."""
    # the job's token in the environment, not on command lines that every user's `ps` shows and recordings keep
    env = {**os.environ, "DDPTOP_STATE_DIR": os.path.join(lab.folder, "jobs"),  # this lab's own job files
           TOKEN_ENV: secrets.token_hex(16)}
    env.pop(LINK_ENV, None)
    env.pop(CPUS_ENV, None)
    if lab.link.bits_per_s is not None:  # the recording keeps it: the hints compare the link's bytes with it
        env[LINK_ENV] = repr(lab.link.bits_per_s)
    if lab.cpus is not None:  # a node's ranks see no cgroup files under `ip netns exec`: its node CPU needs it
        env[CPUS_ENV] = repr(lab.cpus)
    front = lab.popen(0, node_argv(run_argv, lab, nodes, 0, record), quota=False, group=True, env=env)
    front_at = time.monotonic()
    try:
        os.setpgid(front.pid, front.pid)  # also from this side, before the terminal is handed over
    except OSError:
        pass
    terminal = Foreground(front.pid)
    logs, workers = [], []
    try:
        for r in range(1, nodes):
            logs.append(open(os.path.join(lab.folder, f"node{r}.log"), "w"))
            workers.append(lab.popen(r, node_argv(run_argv, lab, nodes, r, None), session=True, env=env,
                                     stdin=subprocess.DEVNULL, stdout=logs[-1], stderr=subprocess.STDOUT))
        signals.job_running = True
        _supervise(lab, front, workers, signals, front_at)
    finally:
        signals.job_running = False
        terminal.restore()
        ended = [_end(proc) for proc in [front, *workers]]
        for log in logs:
            log.close()
    return _exit_code(lab, front, workers, ended[1:])


def stopped_by_user(lab: Lab) -> bool:
    """Whether the job that just ended on `lab` was stopped (Ctrl-C on the screen, which the terminal sends to the
    front alone, or `ddptop ctl stop`) rather than done: the note its front leaves in the lab's jobs folder."""
    from pathlib import Path

    from ddptop.control.token import last_ended_job

    note = last_ended_job(None, None, Path(lab.folder) / "jobs")
    return note is not None and "stopped" in note["how"].split(" after ")[0].split(", ")


def _supervise(lab: Lab, front: subprocess.Popen, workers: list[subprocess.Popen], signals: Signals,
               front_at: float) -> None:
    moved: set[int] = set()
    stop_at = workers_gone_at = None
    while front.poll() is None:
        for signum in signals.take() if time.monotonic() - front_at >= FRONT_START_S else ():
            _signal(front, signal.SIGINT if signum == signal.SIGINT else signal.SIGTERM)
            stop_at = stop_at or time.monotonic()
        _quota_for_rank0(lab, front.pid, moved)
        if workers and all(w.poll() is not None for w in workers):
            workers_gone_at = workers_gone_at or time.monotonic()
            if time.monotonic() - workers_gone_at > LOST_FRONT_S:
                _signal(front, signal.SIGTERM)
                stop_at = stop_at or time.monotonic()
        if stop_at is not None and time.monotonic() - stop_at > FRONT_STOP_S:
            _signal_group(front, signal.SIGKILL)
        time.sleep(0.1)
    # a failed job: the other hosts' ranks are ending too (the same lost collective), and get a moment to say why
    # in their own line; a finished one: they send their last telemetry and leave
    deadline = time.monotonic() + (WORKER_EXIT_S if front.returncode == 0 else FAILED_WORKER_EXIT_S)
    while any(w.poll() is None for w in workers) and time.monotonic() < deadline:
        time.sleep(0.1)


def _quota_for_rank0(lab: Lab, front_pid: int, moved: set[int]) -> None:
    """Rank 0 is the front's child: it joins node 0's CPU quota; the front itself (screen, collector) does not."""
    try:
        children = psutil.Process(front_pid).children(recursive=True)
    except psutil.Error:
        return
    for child in children:
        if child.pid not in moved and lab.join_quota(0, child.pid):
            moved.add(child.pid)


def _signal(proc: subprocess.Popen, signum: int) -> None:
    """To the front alone: its rank-0 child shares its group and must live on until the front stops it."""
    try:
        os.kill(proc.pid, signum)
    except OSError:
        pass


def _signal_group(proc: subprocess.Popen, signum: int) -> None:
    try:
        os.killpg(proc.pid, signum)
    except OSError:
        pass


def _end(proc: subprocess.Popen) -> bool:
    """SIGTERM, then SIGKILL after 5 s: whatever is still running when its job is over. True: it had to be ended."""
    if proc.poll() is not None:
        return False
    proc.terminate()
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    return True


def _exit_code(lab: Lab, front: subprocess.Popen, workers: list[subprocess.Popen], ended: list[bool]) -> int:
    """The front's exit code, else the first host's that failed; one line (and its log) per such host.

    When the front ended well (0: done or stopped) or was interrupted (130), a host that did not is no crash but the
    stop reaching it: Ctrl-C while the ranks start leaves it waiting for a rank 0 that is gone (its handshake fails,
    exit 4, or our own SIGTERM ends it: `exited with signal 15` with an empty log read as a crash, issue 26). A
    failed host makes the front fail too (5: a peer lost), which keeps its line and log."""
    stopped = front.returncode in (0, 130)
    codes = [front.returncode]
    for r, (proc, ours) in enumerate(zip(workers, ended), start=1):
        if proc.returncode == 0:
            continue
        if ours or stopped:
            print(f"ddptop lab: node {r} stopped with the job", file=sys.stderr)
            continue
        tail = _tail(os.path.join(lab.folder, f"node{r}.log"))
        print(f"ddptop lab: node {r} exited with {_how(proc.returncode)}"
              + (f"; its last lines:\n{tail}" if tail else " (its log is empty)"), file=sys.stderr)
        codes.append(proc.returncode)
    code = next((c for c in codes if c), 0)
    return 128 - code if code < 0 else code


def _how(code: int) -> str:
    return f"signal {-code}" if code < 0 else f"code {code}"


def _tail(path: str, lines: int = 5) -> str:
    try:
        with open(path, errors="replace") as f:
            return "".join("  " + line for line in f.readlines()[-lines:] if line.strip()).rstrip()
    except OSError:
        return "  (no log)"
