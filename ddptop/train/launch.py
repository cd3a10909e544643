"""The front process on the master: hosts the store, starts this machine's ranks, feeds their events to a consumer."""

from __future__ import annotations

import multiprocessing
import time
from dataclasses import replace
from typing import Callable, Protocol

from ddptop.config import RunConfig
from ddptop.control import store as stores
from ddptop.control.bus import Collector, LiveSource
from ddptop.events import Source
from ddptop.train.rendezvous import Rendezvous
from ddptop.train.worker import WorkerOptions, rank_entry

GRACE_S = 15.0  # after one rank fails, the others get this long to notice before they are terminated


class Consumer(Protocol):
    """What watches a live job: the headless printer or the TUI. Returns when the job is over or the user quit."""

    def __call__(self, source: Source, job: "LocalJob") -> None: ...


class LocalJob:
    """The rank processes this machine started, as the consumer sees them."""

    def __init__(self, procs: list[multiprocessing.Process], ranks: list[int]):
        self.procs = procs
        self.ranks = ranks
        self._first_failure: float | None = None

    def alive(self) -> bool:
        return any(p.is_alive() for p in self.procs)

    def check(self) -> None:
        """Terminate the survivors some time after a rank failed, so nothing hangs in a dead collective."""
        if self._first_failure is None and any(p.exitcode not in (None, 0) for p in self.procs):
            self._first_failure = time.monotonic()
        if self._first_failure is not None and time.monotonic() - self._first_failure > GRACE_S:
            self.terminate()

    def terminate(self) -> None:
        for p in self.procs:
            if p.is_alive():
                p.terminate()
        for p in self.procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
                p.join()

    def exit_code(self) -> int:
        codes = [p.exitcode for p in self.procs]
        return next((c for c in codes if c not in (0, None)), 0) if all(c is not None for c in codes) else 1


def run_front(cfg: RunConfig, rdv: Rendezvous, options: WorkerOptions, consumer: Callable) -> int:
    """Host the store, start local ranks (all of them for --local, rank 0 for --master/--rank 0), watch them."""
    port = rdv.port or stores.free_port()
    rdv = replace(rdv, port=port)
    server = stores.serve(port)
    ranks = list(range(rdv.world_size)) if rdv.source == "local" else [rdv.rank]
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=rank_entry, args=(cfg, _for_rank(rdv, r), options), name=f"ddptop-rank-{r}")
             for r in ranks]
    for p in procs:
        p.start()
    job = LocalJob(procs, ranks)
    client = stores.ddptop_view(stores.connect("127.0.0.1", port, options.timeout_s, "local"))
    source = LiveSource(Collector(client, rdv.world_size))
    try:
        consumer(source, job)
    except KeyboardInterrupt:
        pass
    finally:
        job.terminate()
        source.close()
        del server
    return job.exit_code()


def _for_rank(rdv: Rendezvous, rank: int) -> Rendezvous:
    if rdv.source == "local":
        return replace(rdv, rank=rank, local_rank=rank)
    return rdv
