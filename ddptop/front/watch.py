"""Provides run_direct (this process is one rank: a worker machine, torchrun, Slurm) and rank 0's collector process.

Without a front process (torchrun, Slurm), rank 0 starts `python -m ddptop.front.watch`: the job's events go
through the same feed as everywhere else (recording, progress lines) in a process of their own, so printing and
writing never take rank 0's training thread or its GIL. Rank 0 hands it the job's coordinates on stdin and
keeps stdin open while it trains; end of file (rank 0 finished, failed or was killed) means: wait for every
rank's last events (at most GRACE_S), write the closing lines, close the recording, exit.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

from ddptop.config import RunConfig
from ddptop.train.rendezvous import Rendezvous

GRACE_S = 10.0  # after rank 0 is done, the other ranks' last events get this long to arrive
START_S = 120.0  # the collector process may need a while to import torch on a busy node


def run_direct(cfg: RunConfig, rdv: Rendezvous, options, log_every: int, record: str | None,
               record_required: bool = False) -> int:
    """Train as one rank; rank 0 also hosts the store (unless torchrun's agent does) and the collector process."""
    from dataclasses import replace

    from ddptop.control.auth import new_job_id
    from ddptop.control.token import remove_job_file, write_job_file
    from ddptop.front.recording import check_new
    from ddptop.train.worker import run_rank

    if rdv.rank != 0 or rdv.agent_store:  # an unreachable master is the one line this run prints
        wait_for_master(rdv.master, rdv.port, options.timeout_s, rdv.source)
    print(f"ddptop: rank {rdv.rank} of {rdv.world_size}, master {rdv.master}:{rdv.port} "
          f"(ranks found by {rdv.source})", file=sys.stderr)
    server = collector = None
    if rdv.rank == 0 and record:
        check_new(record)
    if rdv.rank == 0 and rdv.source != "flags" and not rdv.agent_store:
        from ddptop.control import store as stores

        server = stores.serve(rdv.port, rdv.master)  # kept until the collector has every rank's last events
    if rdv.rank == 0:
        options = replace(options, job_id=new_job_id())  # the collector reads what rank 0's keys seal
        collector = CollectorProcess({"master": rdv.master, "port": rdv.port, "prefix": rdv.key_prefix,
                                      "world_size": rdv.world_size, "source": rdv.source, "rank": rdv.rank,
                                      "timeout_s": options.timeout_s, "token": options.token,
                                      "job_id": options.job_id, "lost_after_s": options.lost_after_s,
                                      "log_every": log_every, "record": record, "record_required": record_required,
                                      "config": cfg.to_dict()})
        write_job_file(rdv.master, rdv.port, options.token, rdv.world_size, rdv.key_prefix)
    try:
        steps = run_rank(cfg, rdv, options)
    finally:
        if collector is not None:
            collector.done()
            remove_job_file(rdv.master, rdv.port)
        del server
    print(f"ddptop: rank {rdv.rank} finished {steps} steps", file=sys.stderr)
    return 0


def wait_for_master(host: str, port: int, timeout_s: float, source: str) -> None:
    """Until the master's port accepts a connection (it may start after this rank), at most `timeout_s`."""
    import socket

    from ddptop.errors import RendezvousError

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            socket.create_connection((host, port), timeout=max(0.1, min(2.0, deadline - time.monotonic()))).close()
            return
        except OSError:
            if time.monotonic() >= deadline:
                raise RendezvousError(f"cannot reach the ddptop master at {host}:{port} (from {source}) after "
                                      f"{timeout_s:g} s: is rank 0 running and the port open?") from None
            time.sleep(0.2)


class CollectorProcess:
    """Rank 0's side: start the collector process, tell it when training is over, wait for it to finish."""

    def __init__(self, spec: dict):
        self.proc = subprocess.Popen([sys.executable, "-m", "ddptop.front.watch"], stdin=subprocess.PIPE,
                                     env=os.environ.copy())
        self.proc.stdin.write(json.dumps(spec).encode() + b"\n")  # on stdin: the token stays out of `ps`
        self.proc.stdin.flush()

    def done(self) -> None:
        try:
            self.proc.stdin.close()  # end of file: rank 0 is done
        except OSError:
            pass
        try:
            self.proc.wait(timeout=GRACE_S + START_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def main() -> int:
    """The collector process: feed the job's events into the recording and the printer until rank 0 is done."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole process group: rank 0 decides
    spec = json.loads(sys.stdin.readline())
    done = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), done.set()), daemon=True).start()
    from ddptop.errors import DdptopError
    from ddptop.front.feed import Feed, SharedState
    from ddptop.front.recording import closing_lines
    from ddptop.headless import HeadlessPrinter

    from ddptop.run import RecorderAlarm, end_recording

    state = SharedState()
    printer = HeadlessPrinter(every=spec["log_every"], state=state)
    alarm = RecorderAlarm(spec.get("record") or "", bool(spec.get("record_required")))
    recorder = _recorder(spec, alarm)
    try:
        source = _source(spec)
    except DdptopError as exc:
        print(f"ddptop: the collector cannot reach the job's store: {exc}", file=sys.stderr)
        source = None
    alarm.source, alarm.stop = source, lambda: _stop_job(spec)
    feed = Feed(source, [recorder] if recorder else [], state=state).start()
    if source is not None:
        _announce(spec)
    done.wait()
    deadline = time.monotonic() + GRACE_S
    world = spec["world_size"]
    while len(printer.finished) + len(printer.lost) < world and time.monotonic() < deadline and source is not None:
        time.sleep(0.1)
    feed.stop()
    printer.finish(traffic=True)
    try:
        kept = end_recording(recorder, spec.get("record") or "", bool(spec.get("record_required")))
    except DdptopError as exc:
        print(f"ddptop: {exc}", file=sys.stderr)
        return exc.exit_code
    if kept:
        snap = state.snapshot()
        for line in closing_lines(spec["record"], snap.step, len(snap.ranks)):
            print(line, flush=True)
    return 0


def _keys(spec: dict):
    from ddptop.control.auth import JobKeys

    return JobKeys.from_token(spec["token"], spec["job_id"])


def _stop_job(spec: dict) -> None:
    """--record-required and the recording failed: ask every rank to stop at its next step."""
    from ddptop.control.client import ControlClient

    try:
        ControlClient(spec["master"], spec["port"], spec["token"], role="front", prefix=spec["prefix"]).request("stop")
    except Exception:
        pass


def _recorder(spec: dict, alarm):
    if not spec.get("record"):
        return None
    from ddptop.errors import DdptopError
    from ddptop.record.sqlite import RecordingWriter, base_meta

    where = {k: spec[k] for k in ("source", "world_size", "master", "rank")}
    try:
        return RecordingWriter(spec["record"], base_meta(spec["config"], where), on_error=alarm)
    except DdptopError as exc:
        print(f"ddptop: not recording: {exc}", file=sys.stderr)
        return None


def _announce(spec: dict) -> None:
    from ddptop.control import store as stores
    from ddptop.front.recording import announce
    from ddptop.safe import clean

    job = _keys(spec)
    try:
        announce(stores.job_view(stores.connect(spec["master"], spec["port"], 5, spec["source"]), spec["prefix"],
                                 job.namespace), job, spec.get("record"))
    except Exception as exc:  # attach then says it does not know
        print(f"ddptop: could not announce the recording to the job's store ({type(exc).__name__}: "
              f"{clean(str(exc), 200)}); `ddptop attach` will not know where it goes", file=sys.stderr)


def _source(spec: dict):
    from ddptop.control import store as stores
    from ddptop.control.bus import Collector, LiveSource, Liveness

    job = _keys(spec)

    def view():
        return stores.job_view(stores.connect(spec["master"], spec["port"], spec["timeout_s"], spec["source"]),
                               spec["prefix"], job.namespace)

    world = spec["world_size"]
    return LiveSource(Collector(view(), world, job),
                      liveness=Liveness(view(), world, job, spec.get("lost_after_s", 10.0)))


if __name__ == "__main__":
    raise SystemExit(main())
