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


def _handed_out(client: ControlClient, request_id: int, timeout_s: float = 30) -> None:
    """Until rank 0's status says it has broadcast `request_id` to the ranks (rank 0 rewrites it every 0.5 s)."""
    deadline = time.monotonic() + timeout_s
    while client.status().get("handed_out", 0) < request_id:
        assert time.monotonic() < deadline, f"request {request_id} not handed to the ranks within {timeout_s:g} s"
        time.sleep(0.1)


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
            _handed_out(first_user, seen["first"])  # the paused ranks go on exchanging rank 0's state: each
            seen["second"] = second_user.request("set", {"strategy": "allreduce"})  # request is handed out alone
            seen["second accepted"] = second_user.response(seen["second"])
            _handed_out(first_user, seen["second"])  # both handed out before the resume: they apply together
            first_user.send("resume")
            seen["first answer"] = _settled(first_user, seen["first"])
            seen["second answer"] = _settled(second_user, seen["second"])
            seen["status"] = first_user.status()
        except Exception as exc:  # said by the test, not lost in this thread
            seen["error"] = repr(exc)
        finally:
            first_user.send("stop")

    cfg = RunConfig(model="tiny", sync=SyncConfig(strategy="ddp", batch_size=16, lr=0.1), steps=100000,
                    synthetic_size=640, span_every=5, eval=False, backend="gloo")
    code, events = run_job(cfg, world_size=WORLD, port=port, token=TOKEN, script=script, timeout_s=60)
    assert code == 0 and "error" not in seen, seen.get("error")
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
