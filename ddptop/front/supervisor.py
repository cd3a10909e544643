"""Provides the local supervisor: the front hosts the store and the job's hub (control/hub.py), starts this machine's
ranks and watches them (LocalJob)."""

from __future__ import annotations

import contextlib
import multiprocessing
from multiprocessing import forkserver
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass, replace
from typing import Callable, Sequence

from ddptop.config import RunConfig
from ddptop.control import session
from ddptop.control import store as stores
from ddptop.control.hub import Hub
from ddptop.control.client import ControlClient
from ddptop.control.auth import JobKeys, new_job_id, new_salt
from ddptop.control.token import remove_job_file, resolve_token, write_job_file
from ddptop.errors import OutputClosed
from ddptop.events import RankLost
from ddptop.front import forks
from ddptop.front.feed import Feed, SharedState
from ddptop.front.pipeline import compose
from ddptop.front.tune import Tuner
from ddptop.rendezvous import Rendezvous
from ddptop import testhooks
from ddptop.testhooks import teardown_hold_s
from ddptop.train.devices import thread_count
from ddptop.train.worker import WorkerOptions, rank_entry

GRACE_S = 15.0  # after one rank fails, the others get this long to notice before they are terminated
STOP_WAIT_S = 20.0  # after a stop request, ranks get this long to finish their step and leave
ENDED_LINGER_S = 1.0  # the store stays up this long after the front's last word when the job took control
# requests: a `ddptop ctl` still waiting reads it every 0.05 s (client.POLL_S), ~20 chances on a busy machine


@dataclass(frozen=True)
class FrontInfo:
    """Where a consumer reaches the job's control plane (the TUI's controls): the store this front hosts."""

    master: str
    port: int
    token: str
    prefix: str = ""  # key namespace under torchrun's agent store


class LocalJob:
    """The rank processes this machine started, as the consumer sees them."""

    def __init__(self, procs: list[multiprocessing.Process], ranks: list[int]):
        self.procs = procs
        self.ranks = ranks
        self.stopped = False  # the user stopped the job (Ctrl-C, SIGTERM, q): ranks ended by that are no failure
        self._failed_before_stop = False
        self.front: FrontInfo | None = None  # set by run_front once the store's port and the token are known
        self.keys = None  # the job's keys (auth.JobKeys), set with `front`
        self.hub = None  # the job's hub (control.hub.Hub) this front hosts, set with `front`
        self._first_failure: float | None = None
        self._reported: set[int] = set()
        self._ended_by_us: set[int] = set()  # pids terminate() signalled: their signal is ours, not their failure
        self._lock = threading.Lock()

    def codes(self) -> list[int | None]:
        """Each rank process's exit code now (None: running), never waiting. One thread at a time: a forked
        rank's code is read once from its server's pipe, and two threads reading it together lost it (255)."""
        with self._lock:
            return [p.exitcode for p in self.procs]

    def lost_events(self) -> list:
        """A RankLost for each local rank process that ended with a failure since the last call."""
        out = []
        for rank, p, code in zip(self.ranks, self.procs, self.codes()):
            if code not in (None, 0) and rank not in self._reported and not self._ours(p, code):
                self._reported.add(rank)
                out.append(RankLost(rank, -1, _how(p.pid, code), time.time()))
        return out

    def outcome(self) -> tuple[bool, str]:
        """(a rank was lost, why), once the ranks ended: the front's last word to a `ddptop ctl` still waiting."""
        ended = sorted((code >= 0, rank, p.pid, code)  # killed ones first: the others exit with code 5 because
                       for rank, p, code in zip(self.ranks, self.procs, self.codes())  # of them
                       if code not in (None, 0) and not self._ours(p, code))
        failed = [f"rank {rank} {_how(pid, code)}" for _, rank, pid, code in ended]
        if failed and not (self.stopped and not self._failed_before_stop):
            return True, "; ".join(failed)
        return False, "stopped" if self.stopped else "its ranks finished: their steps done, or a stop request"

    def _ours(self, proc: multiprocessing.Process, code: int | None) -> bool:
        """Whether a rank's end was our own signal: the user's stop, or the survivors terminated after another
        rank failed (a rank 0 that terminate() killed once rank 1 failed its handshake is no failure of its own)."""
        return code is not None and code < 0 and (self.stopped or proc.pid in self._ended_by_us)

    def alive(self) -> bool:
        return any(code is None for code in self.codes())

    def check(self) -> None:
        """Terminate the survivors some time after a rank failed, so nothing hangs in a dead collective."""
        if self._first_failure is None and any(code not in (None, 0) for code in self.codes()):
            self._first_failure = time.monotonic()
        if self._first_failure is not None and time.monotonic() - self._first_failure > GRACE_S:
            self.terminate()

    def terminate(self) -> None:
        """SIGTERM to the ranks still running, SIGKILL to those still there 10 s later."""
        for signum in (signal.SIGTERM, signal.SIGKILL):
            for p, code in zip(self.procs, self.codes()):
                if code is None:
                    self._ended_by_us.add(p.pid)
                    with contextlib.suppress(OSError):
                        os.kill(p.pid, signum)
            deadline = time.monotonic() + 10
            while self.alive() and time.monotonic() < deadline:
                time.sleep(0.02)

    def stop(self) -> None:
        """The user asked the job to stop; what ends the ranks from now on is that, not a failure."""
        if not self.stopped:
            self.stopped = True
            self._failed_before_stop = any(code not in (None, 0) for code in self.codes())

    def exit_code(self) -> int:
        """README's code: the first failed rank's own (4 handshake, 5 a peer lost, 6 ...), 5 for a rank a signal
        killed that was not ours (a peer lost); ranks ended by our own signal count only when no rank failed else."""
        codes = self.codes()
        if self.stopped and not self._failed_before_stop and all(c is not None and c <= 0 for c in codes):
            return 0  # ranks the stop had to terminate (killed by our own signal) did not fail
        if not all(c is not None for c in codes):
            return 1
        failed = [c for p, c in zip(self.procs, codes) if c not in (0, None) and not self._ours(p, c)]
        failed = failed or [c for c in codes if c not in (0, None)]
        code = failed[0] if failed else 0
        return 5 if code < 0 else code  # a negative one left sys.exit(-15): exit status 241


def run_front(cfg: RunConfig, rdv: Rendezvous, options: WorkerOptions, consumer: Callable, sinks: Sequence = (),
              state: SharedState | None = None, alarm=None, on_start: Callable[["LocalJob"], None] | None = None,
              tune: str = "") -> int:
    """Host the store, start local ranks (all of them for --local, rank 0 for --master/--rank 0), watch them through
    the front's pipeline (`consumer(feed, job)`: the screen or the printer). Its tuner answers `ctl tune`,
    and with `tune` ("bucket" or "strategy") tunes that once the run started (`--tune`).

    Ctrl-C or SIGTERM at any moment from here on is a stop: ranks that train finish their step and leave,
    ranks still starting are terminated, and the exit code is 0 (README: Failures)."""
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    job = None
    try:
        server = stores.serve(rdv.port, rdv.master)  # port 0: the system picks a free one
        rdv = replace(rdv, port=server.port)
        token = options.token or resolve_token(None)[0]
        options = replace(options, token=token, check_token=options.check_token or rdv.source == "local",
                          job_id=options.job_id or new_job_id(), salt=new_salt())
        keys = JobKeys.from_token(token, options.job_id, options.salt)
        hub = Hub(rdv.master, keys, rdv.world_size, options.lost_after_s,
                  public=stores.connect(rdv.master, rdv.port, options.timeout_s, rdv.source))
        session.publish(stores.ddptop_view(server), options.salt, hub.endpoints())  # before any rank looks
        job = LocalJob([], [])
        job.keys, job.hub = keys, hub
        _start_ranks(cfg, rdv, options, job)
        write_job_file(rdv.master, rdv.port, token, rdv.world_size)
        job.front = FrontInfo(rdv.master, rdv.port, token)
        feed = compose(hub.source, world_size=rdv.world_size, job=job, sinks=sinks, state=state, alarm=alarm,
                       tuner=Tuner(lambda: ControlClient(rdv.master, rdv.port, token, role="tune"), auto=tune),
                       liveness=hub.liveness, front_cost=True)
        state = feed.state  # what the ranks said at their end, for the note left once the job ended
        if on_start is not None:
            on_start(job)
        _watch(consumer, feed, job)
    except KeyboardInterrupt:
        if job is None:
            raise
        if not job.stopped:  # before anything was watched: the ranks are still starting, terminating them is the stop
            print("ddptop: stopped while the ranks were starting", file=sys.stderr)
        job.stop()
    finally:
        with _ctrl_c_ignored():  # the teardown runs whole: a second Ctrl-C here skipped the job file's removal and
            signal.signal(signal.SIGTERM, previous)  # made a clean stop exit 130 ("interrupted", CI once)
            if job is not None:
                time.sleep(teardown_hold_s())  # test-only: 0 otherwise
                job.terminate()
                _stop_server()
                _say_ended(rdv, options, job)
                remove_job_file(rdv.master, rdv.port, how=_ended_how(job, state))
                if job.hub is not None:
                    job.hub.close()
    return job.exit_code()


def _ended_how(job: "LocalJob", state: SharedState | None) -> str:
    """How the job ended, for the note `ddptop ctl` reads once it is gone: which rank failed, else how the ranks
    said they finished (done, stopped: a `ctl stop` is a stop too) after how many steps."""
    lost, why = job.outcome()
    if lost:
        return f"exit code {job.exit_code()}: {why}"
    views = list(state.state.ranks.values()) if state is not None else []
    reasons = sorted({v.state for v in views if v.state in ("done", "stopped", "error")})
    steps = max((v.last.step + 1 for v in views if v.last is not None), default=0)
    if not reasons:
        return "stopped" if job.stopped else "its ranks finished"
    return f"{', '.join(reasons)} after {steps} steps"


def _how(pid: int, code: int) -> str:
    how = f"killed by signal {-code}" if code < 0 else f"exited with code {code}"
    return f"process {pid} {how}"


def _say_ended(rdv: Rendezvous, options: WorkerOptions, job: "LocalJob") -> None:
    """Tell a `ddptop ctl` waiting on a request how the job ended (the hub's `ended`) and keep the front up
    ENDED_LINGER_S for it to read, when the job took any request and was not stopped at the front."""
    if job.hub is None:
        return
    lost, why = job.outcome()
    job.hub.say(ended={"lost": lost, "why": why, "code": job.exit_code()})
    if not job.stopped and job.hub.made > 0:  # a stop at the front (Ctrl-C, SIGTERM, q) ends at once, as before:
        try:  # a `ctl` waiting then says the job went away (exit 5)
            time.sleep(ENDED_LINGER_S)
        except KeyboardInterrupt:  # a second Ctrl-C ends the wait, never the exit
            pass


def _start_ranks(cfg: RunConfig, rdv: Rendezvous, options: WorkerOptions, job: "LocalJob") -> None:
    """Start this machine's ranks into `job`. They start with SIGINT ignored, so a Ctrl-C while they start is the
    front's alone: spawned ranks inherit it from the front, forked ones (several CPU ranks, `_context`) from the
    server they fork from, started in that window. The start of a forked rank waits for the server's imports
    (seconds): it waits outside the window, so a Ctrl-C then is a stop while the ranks start."""
    ranks = list(range(rdv.world_size)) if rdv.source == "local" else [rdv.rank]
    ctx = _context(cfg, len(ranks), forks.fronted(rdv))
    forked = ctx.get_start_method() == "forkserver"
    options = replace(options, test_env=testhooks.carried())
    procs = [ctx.Process(target=rank_entry, args=(cfg, _for_rank(rdv, r), options), name=f"ddptop-rank-{r}")
             for r in ranks]
    interrupt = signal.signal(signal.SIGINT, signal.SIG_IGN)
    omp = os.environ.get("OMP_NUM_THREADS")
    # every thread of a rank computes with its thread count, not only the main one (torch.set_num_threads):
    # PowerSGD's math runs in gloo's callback threads, and there 2 OpenMP threads, not 1, made the two ranks'
    # models differ by 2e-10 after 11 steps (fingerprints apart); torchrun sets 1 the same way
    os.environ.setdefault("OMP_NUM_THREADS", str(thread_count(cfg.threads, _for_rank(rdv, ranks[0]).local_world_size)))
    try:
        if forked:
            forkserver.ensure_running()  # spawns the server (its imports run in the background)
        else:
            _start(job, procs, ranks)
    finally:
        signal.signal(signal.SIGINT, interrupt)
        if omp is None:
            os.environ.pop("OMP_NUM_THREADS", None)
    if forked:
        _start(job, procs, ranks)


def _start(job: "LocalJob", procs: list, ranks: list[int]) -> None:
    for p, rank in zip(procs, ranks):
        p.start()
        job.procs.append(p)
        job.ranks.append(rank)


def forked(cfg: RunConfig, rdv: Rendezvous) -> bool:
    """Whether this machine's ranks fork from a server (front/forks.py can start it out of the command itself)."""
    local = rdv.world_size if rdv.source == "local" else 1
    return _context(cfg, local, forks.fronted(rdv)).get_start_method() == "forkserver"


def _context(cfg: RunConfig, local_ranks: int, own: bool) -> multiprocessing.context.BaseContext:
    """CPU ranks fork from one server that imported their modules once: several ranks, or a front's `own` (--local,
    or rank 0 beside a --rank 0 front: the command forks the server out of itself, front/forks.py, so even one
    rank's torch is the command's, ~5 CPU-s less than a fresh interpreter's). Ranks that may use CUDA start as
    fresh interpreters (a process that touched CUDA is never forked)."""
    spawn = multiprocessing.get_context("spawn")
    # asked for CUDA: the rank says what is wrong with that, as before (devices.place would refuse it here)
    if local_ranks < (1 if own else 2) or cfg.device == "cuda" or cfg.backend == "nccl":
        return spawn
    from ddptop.train import devices

    if devices.place(cfg.backend, cfg.device, local_ranks, devices.visible_gpus()).device != "cpu":
        return spawn
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(list(forks.PRELOAD))  # a rank's own imports took ~4.5 CPU-s each here
    return ctx


def _stop_server() -> None:
    """The server goes with its job, so that the next job in this process (tests run many) starts one with its own
    environment (OMP_NUM_THREADS, the test hooks); killed, not asked: it may still be importing (a Ctrl-C while
    the ranks start), and a rank that would not end goes with it (it dies with its parent)."""
    server = getattr(forkserver, "_forkserver", None)
    pid = getattr(server, "_forkserver_pid", None)
    if pid is None or not hasattr(server, "_stop"):
        return
    with contextlib.suppress(OSError):
        os.kill(pid, signal.SIGKILL)
    server._stop()


def _watch(consumer: Callable, feed: Feed, job: "LocalJob") -> None:
    try:
        consumer(feed, job)
    except (KeyboardInterrupt, OutputClosed) as exc:  # the output's reader gone (`| head`): a stop, as a Ctrl-C
        job.stop()
        with _ctrl_c_ignored():  # a second Ctrl-C 0.2 s later cut the closing lines in two (issue 26)
            _stop_gracefully(job)
            consumer.finish(feed, job)
        if isinstance(exc, OutputClosed):  # cli.main: one line, exit 141; the teardown and the recording's end first
            raise OutputClosed(f"{exc}: the job was stopped") from None
    finally:
        feed.stop()  # idempotent: the consumer's finish has usually stopped it already


@contextlib.contextmanager
def _ctrl_c_ignored():
    """While the stop is under way (at most STOP_WAIT_S, then the ranks are terminated) and its closing lines and
    the recording's end are written, more Ctrl-Cs change nothing: the stop is already the answer. SIGTERM still
    interrupts, as before: a supervisor's way out of a stop that hangs."""
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt


def _stop_gracefully(job: LocalJob) -> None:
    """Ask every rank to stop at the next step boundary; terminate whatever is still there after STOP_WAIT_S."""
    front = job.front
    try:
        ControlClient(front.master, front.port, front.token, role="front").request("stop")
    except Exception:  # rank 0 has not reported yet (still starting): terminating it is the stop
        print("ddptop: stopped while the ranks were starting", file=sys.stderr)
        job.terminate()
    deadline = time.monotonic() + STOP_WAIT_S
    while job.alive() and time.monotonic() < deadline:
        time.sleep(0.1)


def _for_rank(rdv: Rendezvous, rank: int) -> Rendezvous:
    if rdv.source == "local":
        return replace(rdv, rank=rank, local_rank=rank)
    return rdv
