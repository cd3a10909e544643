"""Two `set` requests while a real 2-rank job is paused: both are in force after resume, both clients told so."""

from __future__ import annotations

import time

from ddptop.config import RunConfig, SyncConfig
from ddptop.control.client import ControlClient
from ddptop.events import ConfigApplied
from jobs import connect, run_job
import ports

TOKEN = "pause-sets-token"
WORLD = 2


def _connect(port: int) -> ControlClient:
    return connect(port, TOKEN, 60)


def _settled(client: ControlClient, request_id: int, timeout_s: float = 20) -> dict:
    """Rank 0's answer once it is no longer "pending" (or the pending one, after `timeout_s`)."""
    deadline = time.monotonic() + timeout_s
    answer = client.response(request_id)
    while answer.get("state") == "pending" and time.monotonic() < deadline:
        time.sleep(0.1)
        answer = client.response(request_id)
    return answer


def test_two_sets_during_a_pause_are_both_applied_and_both_answered():
    port = ports.port()
    seen: dict = {}

    def script(collected):
        first_user = _connect(port)
        second_user = _connect(port)
        try:
            first_user.send("pause")
            deadline = time.monotonic() + 30
            while not first_user.status()["paused"] and time.monotonic() < deadline:
                time.sleep(0.1)
            seen["paused"] = first_user.status()["paused"]
            seen["first"] = first_user.request("set", {"lr": 0.05})
            seen["first accepted"] = first_user.response(seen["first"])
            time.sleep(0.5)  # the paused ranks go on exchanging rank 0's state: each request is handed out alone
            seen["second"] = second_user.request("set", {"strategy": "allreduce"})
            seen["second accepted"] = second_user.response(seen["second"])
            time.sleep(0.5)
            first_user.send("resume")
            seen["first answer"] = _settled(first_user, seen["first"])
            seen["second answer"] = _settled(second_user, seen["second"])
            seen["status"] = first_user.status()
        finally:
            first_user.send("stop")

    cfg = RunConfig(model="tiny", sync=SyncConfig(strategy="ddp", batch_size=16, lr=0.1), steps=100000,
                    synthetic_size=640, span_every=5, eval=False, backend="gloo")
    code, events = run_job(cfg, world_size=WORLD, port=port, token=TOKEN, script=script, timeout_s=60)
    assert code == 0
    assert seen["paused"]
    assert seen["first accepted"]["state"] == seen["second accepted"]["state"] == "pending"
    first, second = seen["first answer"], seen["second answer"]
    assert second["ok"] and second["state"] == "applied" and "merged_into" not in second
    assert first["ok"] and first["state"] == "applied", f"the first client is told its change is in force: {first}"
    assert first["merged_into"] == seen["second"] and (first["step"], first["segment"]) == (second["step"],
                                                                                             second["segment"])
    assert seen["status"]["config"]["lr"] == 0.05 and seen["status"]["config"]["strategy"] == "allreduce"
    switches = [(e.rank, e.request_id, e.step, e.config["strategy"], e.config["lr"]) for e in events
                if isinstance(e, ConfigApplied) and e.request_id > 0]
    assert sorted(switches) == [(rank, seen["second"], second["step"], "allreduce", 0.05) for rank in range(WORLD)]
