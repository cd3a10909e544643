"""The client side of the control plane, shared by `ddptop ctl` and the TUI: status, set, pause, resume, stop."""

from __future__ import annotations

import json
import os
import time
from datetime import timedelta
from typing import Any

from ddptop.config import SyncConfig
from ddptop.control import keys
from ddptop.control import store as stores
from ddptop.control.commands import apply_changes, make_request, who_am_i
from ddptop.control.token import TOKEN_ENV, find_job
from ddptop.errors import DdptopError, RendezvousError, UsageError


class ControlError(DdptopError):
    exit_code = 1


class ControlClient:
    def __init__(self, master: str, port: int, token: str, role: str = "ctl", timeout_s: float = 5.0,
                 prefix: str = ""):
        self.master, self.port, self.token, self.prefix = master, port, token, prefix
        self.who = who_am_i(role)
        self.store = stores.ddptop_view(stores.connect(master, port, timeout_s, "ctl"), prefix)

    @classmethod
    def find(cls, master: str | None, port: int | None, token: str | None, role: str = "ctl",
             prefix: str | None = None) -> "ControlClient":
        """Fill what was not typed from this machine's job file (the job's front process wrote it)."""
        job = find_job(port) if master in (None, "127.0.0.1", "localhost") else None
        if port is None and job is None:
            raise RendezvousError("no ddptop job runs on this machine: give --master and --port")
        token = token or os.environ.get(TOKEN_ENV) or (job or {}).get("token")
        if not token:
            raise UsageError("no token for that job: pass --token or set DDPTOP_TOKEN")
        prefix = prefix if prefix is not None else str((job or {}).get("prefix", ""))
        return cls(master or (job or {}).get("master", "127.0.0.1"), port or job["port"], token, role, prefix=prefix)

    def status(self) -> dict[str, Any]:
        if not self.store.check([keys.STATUS]):
            raise ControlError(f"the job at {self.master}:{self.port} has not reported its status yet")
        status = json.loads(self.store.get(keys.STATUS))
        ranks = []
        for rank in range(int(status.get("world_size", 0))):
            beat = self.store.get(keys.heartbeat(rank)) if self.store.check([keys.heartbeat(rank)]) else b"{}"
            ranks.append({"rank": rank, **json.loads(beat)})
        return {**status, "age_s": max(0.0, time.time() - status.get("t", 0)), "ranks": ranks}

    def check_set(self, changes: dict[str, Any]) -> SyncConfig:
        """Validate against the config in force before sending anything (the UI shows this inline)."""
        current = SyncConfig(**self.status()["config"])
        return apply_changes(current, changes)

    def request(self, op: str, changes: dict[str, Any] | None = None) -> int:
        if op == "set":
            self.check_set(changes or {})
        request_id = self.store.add(keys.CTL_SEQ, 1)
        self.store.set(keys.ctl_request(request_id), make_request(self.token, op, changes, self.who))
        return request_id

    def response(self, request_id: int, timeout_s: float = 10.0) -> dict[str, Any]:
        try:
            self.store.wait([keys.ctl_response(request_id)], timedelta(seconds=timeout_s))
        except Exception:
            raise ControlError(f"rank 0 did not answer within {timeout_s:g} s") from None
        return json.loads(self.store.get(keys.ctl_response(request_id)))

    def send(self, op: str, changes: dict[str, Any] | None = None, wait_applied: bool = True,
             timeout_s: float = 30.0) -> dict[str, Any]:
        """Send and wait for rank 0's answer; for `set`, until every rank applied it (or `timeout_s`)."""
        request_id = self.request(op, changes)
        deadline = time.monotonic() + timeout_s
        answer = self.response(request_id, timeout_s)
        if not answer.get("ok"):
            raise ControlError(f"refused: {answer.get('error')}")
        accepted_step = answer.get("step")
        while op == "set" and wait_applied and answer.get("state") != "applied":
            if answer.get("state") == "rolled back":  # a batch that did not fit: the job trains on as before
                raise ControlError(str(answer.get("error")))
            if time.monotonic() > deadline:
                raise ControlError(f"request {request_id} accepted but not applied within {timeout_s:g} s")
            time.sleep(0.05)
            answer = json.loads(self.store.get(keys.ctl_response(request_id)))
        return {"request_id": request_id, "accepted_step": accepted_step, **answer}

