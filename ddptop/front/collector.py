"""Provides rank 0's collector process under torchrun/Slurm: `python -m ddptop.front.collector`.

Without a front process (torchrun, Slurm), rank 0 starts `python -m ddptop.front.collector`: the job's events go
through the same feed as everywhere else (recording, progress lines) in a process of their own, so printing and
writing never take rank 0's training thread or its GIL. Rank 0 hands it the job's coordinates on stdin and
keeps stdin open while it trains; end of file (rank 0 finished, failed or was killed) means: wait for every
rank's last events (at most GRACE_S), write the closing lines, close the recording, exit.
"""

from __future__ import annotations

import json
import signal
import sys
import threading
import time

GRACE_S = 10.0  # after rank 0 is done, the other ranks' last events get this long to arrive


def main() -> int:
    """The collector process: feed the job's events into the recording and the printer until rank 0 is done."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole process group: rank 0 decides
    done = threading.Event()
    # torchrun ends a failed job with SIGTERM to each rank's process group, this process included: that is rank 0
    # being done too, and the recording is closed as at any end (without this it was left open, -wal and all)
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    spec = json.loads(sys.stdin.readline())
    threading.Thread(target=lambda: (sys.stdin.read(), done.set()), daemon=True).start()
    from ddptop.errors import DdptopError
    from ddptop.front.feed import SharedState
    from ddptop.front.headless import HeadlessPrinter
    from ddptop.front.pipeline import compose
    from ddptop.front.recording import RecorderAlarm, end_recording
    from ddptop.record.paths import closing_lines

    state = SharedState()
    printer = HeadlessPrinter(every=spec["log_every"], state=state)
    alarm = RecorderAlarm(spec.get("record") or "", bool(spec.get("record_required")))
    recorder = _recorder(spec, alarm)
    try:
        source, liveness = _source(spec)
    except DdptopError as exc:
        print(f"ddptop: the collector cannot host the job's sockets: {exc}", file=sys.stderr)
        source = liveness = None
    alarm.stop = lambda: _stop_job(spec)
    feed = compose(source, world_size=spec["world_size"], liveness=liveness, sinks=[recorder] if recorder else [],
                   state=state, alarm=alarm, tuner=_tuner(spec) if source is not None else None,
                   front_cost=True).start()
    if source is not None:
        from ddptop.control.announce import announce

        announce(spec["hub"], spec.get("record"))
    while not done.wait(0.5):  # a timed wait: the SIGTERM handler runs between two
        pass
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
    if "hub" in spec:
        spec["hub"].close()
    return 0


def _keys(spec: dict):
    from ddptop.control.auth import JobKeys

    if "keys" not in spec:  # scrypt once per process
        spec["keys"] = JobKeys.from_token(spec["token"], spec["job_id"], bytes.fromhex(spec["salt"]))
    return spec["keys"]


def _store(spec: dict):
    from ddptop.control import store as stores

    return stores.connect(spec["master"], spec["port"], spec["timeout_s"], spec["source"])


def _tuner(spec: dict):
    """The tuner that answers `ddptop ctl tune bucket` (--tune is a front's flag: refused under torchrun)."""
    from ddptop.control.client import ControlClient
    from ddptop.front.tune import Tuner

    return Tuner(lambda: ControlClient(spec["master"], spec["port"], spec["token"], role="tune", prefix=spec["prefix"]))


def _stop_job(spec: dict) -> None:
    """--record-required and the recording failed: ask every rank to stop at its next step."""
    from ddptop.control.client import ControlClient

    try:
        ControlClient(spec["master"], spec["port"], spec["token"], role="front", prefix=spec["prefix"]).request("stop")
    except Exception as exc:  # rank 0 is gone already or not answering: nothing else can stop it from here
        print(f"ddptop: could not ask the job to stop ({exc}); it goes on without its recording", file=sys.stderr)


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


def _source(spec: dict):
    """Host the job's hub and say where it listens in the store's public keys (the ranks wait for it)."""
    from ddptop.control import session
    from ddptop.control import store as stores
    from ddptop.control.hub import Hub

    hub = spec["hub"] = Hub(spec["master"], _keys(spec), spec["world_size"], spec.get("lost_after_s", 10.0),
                            public=_store(spec))
    session.publish(stores.ddptop_view(_store(spec), spec["prefix"]), endpoints=hub.endpoints())
    return hub.source, hub.liveness


if __name__ == "__main__":
    raise SystemExit(main())
