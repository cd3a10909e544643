"""Run a real ddptop job (front process + spawned gloo ranks) and collect every event it produced."""

from __future__ import annotations

import contextlib
import subprocess
import threading
import time

from ddptop.config import RunConfig, SyncConfig
from ddptop.control.client import ControlClient
from ddptop.events import Event, StepDone, StepSpans
from ddptop.front.supervisor import run_front
from ddptop.rendezvous import Rendezvous
from ddptop.train.worker import WorkerOptions


def tiny_config(**sync_changes) -> RunConfig:
    steps = sync_changes.pop("steps", 4)
    model = sync_changes.pop("model", "tiny")
    span_every = sync_changes.pop("span_every", 1)
    sync = SyncConfig(**{"batch_size": 16, **sync_changes})
    return RunConfig(model=model, sync=sync, steps=steps, span_every=span_every, synthetic_size=640, eval=False,
                     backend="gloo")


def run_job(cfg: RunConfig, world_size: int = 2, timeout_s: float = 30.0, port: int = 0, token: str = "",
            script=None) -> tuple[int, list[Event]]:
    """Run a job to its end; `script(collected)` runs in a thread beside it (to drive the control plane)."""
    collected: list[Event] = []

    class Collect:  # a sink of the front's pipeline, like the recording
        def handle(self, events: list[Event]) -> None:
            collected.extend(events)

    def consumer(feed, job):
        if script is not None:
            threading.Thread(target=script, args=(collected,), daemon=True).start()
        while job.alive():
            feed.pump()
            time.sleep(0.1)
        feed.stop()

    if cfg.backend == "auto":  # gloo on CPU on every machine, a GPU one too: the tests' ground truth is CPU training
        cfg = cfg.replace(backend="gloo")
    rdv = Rendezvous("127.0.0.1", port, 0, world_size, 0, world_size, "local")
    code = run_front(cfg, rdv, WorkerOptions(timeout_s=timeout_s, token=token), consumer, sinks=[Collect()])
    return code, collected


def steps_of(events: list[Event], rank: int | None = None) -> list[StepDone]:
    return [e for e in events if isinstance(e, StepDone) and (rank is None or e.rank == rank)]


def spans_of(events: list[Event], rank: int | None = None) -> list[StepSpans]:
    return [e for e in events if isinstance(e, StepSpans) and (rank is None or e.rank == rank)]


def connect(port: int, token: str, timeout_s: float = 60.0) -> ControlClient:
    """A control client of the job on `port`, once rank 0 answers (the ranks may still be importing torch)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            client = ControlClient("127.0.0.1", port, token)
            client.status()
            return client
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


@contextlib.contextmanager
def killed_if_left(proc: subprocess.Popen):
    """A job a test drives: whatever happens in the block (a failed assert, a timeout), it is not left running."""
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


@contextlib.contextmanager
def torchrun(args: list[str], env: dict, cwd=None, ranks: int = 2):
    """`torchrun --nproc-per-node RANKS ARGS` as README writes it, output piped. Whatever happens in the block, its
    process group and every process under it are killed: torchrun's ranks outlive a killed torchrun."""
    import os
    import signal
    import sys

    import ports

    launcher = os.path.join(os.path.dirname(sys.executable), "torchrun")
    job = subprocess.Popen([launcher, "--nnodes", "1", "--nproc-per-node", str(ranks), "--master-port",
                            str(ports.port()), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           env=env, cwd=cwd, start_new_session=True)
    try:
        yield job
    finally:
        if job.poll() is None:  # its ranks and collector too: torchrun starts them in sessions of their own, where
            import psutil  # the group's kill does not reach

            try:
                left = psutil.Process(job.pid).children(recursive=True)
            except psutil.Error:
                left = []
            os.killpg(job.pid, signal.SIGKILL)
            for child in left:
                with contextlib.suppress(psutil.Error):
                    child.kill()
            job.wait()
