"""The client side of the control plane, shared by `ddptop ctl` and the TUI: status, set, pause, resume, stop.

It talks to the job's front over one Session (session.py: CURVE with the ctl key derived from the token). What it
reads is checked before use: the status must have the right types and ranges (a bad one is retried for a moment
and then reported in one line), recent steps are decoded like any event, never parsed on trust.
"""

from __future__ import annotations

import math
import os
import time
from datetime import timedelta
from typing import Any

from ddptop.config import SyncConfig
from ddptop.control import keys, litestore, session
from ddptop.control.auth import BadValue, JobKeys, stretch
from ddptop.control.commands import apply_changes, make_request, who_am_i
from ddptop.control.token import TOKEN_ENV, check_token, find_job, last_ended_job
from ddptop.errors import DdptopError, PeerLost, RendezvousError, UsageError
from ddptop.events import EventDecodeError, StepDone, event_from_dict
from ddptop.safe import clean

MAX_WORLD_SIZE = 65536
STATUS_WAIT_S = 2.0  # rank 0 rewrites its status every 0.5 s: a bad or missing one is retried this long
POLL_S = 0.05  # a waiting request reads its answer and the job's last word this often (the front keeps its
# sockets ENDED_LINGER_S = 1 s after writing that word: ~20 reads)


class ControlError(DdptopError):
    exit_code = 1


class JobEnded(ControlError):
    """The job finished or was stopped while a request waited: it was never applied (exit 1, README)."""


def _nothing_runs(master: str | None) -> str:
    """No job runs here: say so, and how the last one that ran here ended, if one did (its front left a note)."""
    ended = last_ended_job(master, None)
    if ended is None:
        return "no ddptop job runs on this machine: give --master and --port"
    when = time.strftime("%H:%M:%S", time.localtime(ended["ended"]))
    ago = max(0, round(time.time() - ended["ended"]))
    return (f"the ddptop job at {ended.get('master', '?')}:{ended['port']} ended at {when} ({ago} s ago: "
            f"{ended['how']}); no ddptop job runs on this machine now (give --master and --port for one elsewhere)")


class ControlClient:
    """`role` names who asks in every request (`ctl`, `tui`, `tune`, `front`); `attach` connects with the attach key,
    which may read the status but never send a request (hub.RIGHTS)."""

    def __init__(self, master: str, port: int, token: str, role: str = "ctl", timeout_s: float = 5.0,
                 prefix: str = ""):
        self.master, self.port, self.token, self.prefix = master, port, check_token(token), prefix
        self.who = who_am_i(role)
        # plain Python, not torch's TCPStore: `ddptop ctl` answers in a fraction of a second (README). The store
        # only says where the job's front listens and its salt; everything else goes over its sockets (hub.py)
        public = litestore.connect(master, port, timeout_s, f"{keys.DDPTOP_PREFIX}{prefix}")
        try:
            self.key = stretch(self.token, session.read_salt(public, STATUS_WAIT_S))
            self.ports = session.read_endpoints(public, STATUS_WAIT_S)
        except session.SessionTimeout:
            raise ControlError(f"no ddptop job answers at {master}:{port}: its store does not say where its front "
                               "listens (a job still starting, or not a ddptop job)") from None
        except (ConnectionError, OSError) as exc:  # the job ended while this client was starting
            raise PeerLost(f"the job at {master}:{port} went away ({exc})") from None
        finally:
            public.close()
        self.timeout_s = timeout_s
        self.role = "attach" if role == "attach" else "ctl"
        self.session = session.Session(master, self.ports["ctl"], JobKeys("", b"", "", self.key), self.role,
                                       max(timeout_s, 10))
        self._job: JobKeys | None = None
        self.steps: dict[int, list[StepDone]] = {}

    def _call(self, op: str, body: dict | None = None) -> dict[str, Any]:
        try:
            return self.session.call(op, body)
        except session.SessionRefused:
            raise ControlError(f"no ddptop job with this token answers at {self.master}:{self.port} "
                               "(a wrong --token or DDPTOP_TOKEN)") from None

    @classmethod
    def find(cls, master: str | None, port: int | None, token: str | None, role: str = "ctl",
             prefix: str | None = None) -> "ControlClient":
        """Fill what was not typed from this machine's job file (the job's front process wrote it)."""
        if port is not None and not 1 <= port <= 65535:
            raise UsageError(f"--port must be between 1 and 65535, got {port}")
        job = find_job(master if master != "localhost" else None, port)  # a job this machine started, if any
        if port is None and job is None:
            raise RendezvousError(_nothing_runs(master if master != "localhost" else None))
        token = token or os.environ.get(TOKEN_ENV) or (job or {}).get("token")
        master = master or (job or {}).get("master", "127.0.0.1")
        port = port or job["port"]
        if not token:
            litestore.connect(master, port, 5.0).close()  # nothing there: say that, not that a token is missing
            raise UsageError(f"no token for the job on {master}:{port}: pass --token or set DDPTOP_TOKEN")
        prefix = prefix if prefix is not None else str((job or {}).get("prefix", ""))
        return cls(master, port, token, role, prefix=prefix)

    @property
    def job(self) -> JobKeys:
        if self._job is None:
            self.status()
        return self._job

    def status(self, steps: bool = False) -> dict[str, Any]:
        """Rank 0's status and each rank's newest beat; `steps`: also each rank's newest steps, kept in
        `self.steps` (one round trip for `ctl status`)."""
        reply = self._read_status(steps)
        self.steps = _decoded(reply.get("steps"))
        status = reply["status"]
        self._job = JobKeys.from_control(self.key, status["job"])
        beats = reply.get("beats") if isinstance(reply.get("beats"), dict) else {}
        ranks = [{"rank": rank, **_step(beats.get(str(rank)))} for rank in range(status["world_size"])]
        return {**status, "age_s": max(0.0, time.time() - status["t"]), "ranks": ranks}

    def _read_status(self, steps: bool = False) -> dict[str, Any]:
        deadline = time.monotonic() + STATUS_WAIT_S
        why = None
        while True:
            reply = self._call("status", {"steps": steps})
            if isinstance(reply.get("status"), dict):
                try:
                    return {**reply, "status": _checked_status(reply["status"])}
                except BadValue as exc:
                    why = str(exc)
            if time.monotonic() > deadline:
                break
            time.sleep(0.1)
        if why:
            raise ControlError(f"the job's status at {self.master}:{self.port} is refused ({why})")
        raise ControlError(f"the ddptop job at {self.master}:{self.port} has no status yet (its ranks still starting)")

    def recent_steps(self) -> dict[int, list[StepDone]]:
        """Each rank's newest steps (hub.RECENT at most) as the front received them, decoded like any event."""
        return _decoded(self._call("status", {"steps": True}).get("steps"))

    def recording(self) -> str | None:
        """`host:path` of the job's recording, `` when it records nothing, None when the job did not say."""
        data = self._call("status").get("recording")
        if not isinstance(data, dict):
            return None
        path, host = clean(str(data.get("path", "")), 300), clean(str(data.get("host", "")), 100)
        return f"{host}:{path}" if path else ""

    def check_set(self, changes: dict[str, Any]) -> SyncConfig:
        """Validate against the config in force before sending anything (the UI shows this inline)."""
        return apply_changes(SyncConfig(**self._read_status()["status"]["config"]), changes)

    def request(self, op: str, changes: dict[str, Any] | None = None) -> int:
        if op == "set":
            self.check_set(changes or {})
        else:
            self._read_status()  # rank 0 must be there to take it: a job still starting refuses (ControlError)
        request_id = self._call("request", make_request(op, changes, self.who)).get("id")
        if not isinstance(request_id, int) or not 0 < request_id < keys.MAX_COUNTER:
            raise ControlError(f"the job's front gave request id {clean(request_id, 30)}: not one")
        return request_id

    def response(self, request_id: int, timeout_s: float = 10.0) -> dict[str, Any]:
        return self._await(request_id, time.monotonic() + timeout_s, lambda answer: True,
                           f"rank 0 did not answer within {timeout_s:g} s")

    def _await(self, request_id: int, deadline: float, done, late: str) -> dict[str, Any]:
        """Rank 0's answer once `done(answer)`. A wait that ends otherwise says how in one line, with README's code:
        the job's word that it ended (a rank lost: PeerLost, 5; finished or stopped: JobEnded, 1), its front gone
        without a word (PeerLost, 5), or `deadline` passed (ControlError, 1)."""
        try:
            while True:
                reply = self._call("answer", {"id": request_id})
                answer = reply.get("answer")
                if isinstance(answer, dict) and done(answer):
                    return answer
                _check_ended(reply.get("ended"), request_id)
                if time.monotonic() > deadline:
                    raise ControlError(late)
                time.sleep(POLL_S)
        except session.SessionError as exc:  # the hub lives in the job's front process
            raise PeerLost(f"the job at {self.master}:{self.port} went away while request {request_id} waited "
                           f"({exc or type(exc).__name__})") from None

    def poll(self, request_id: int) -> dict[str, Any] | None:
        """The answer to `request_id` now, or None while there is none (a waiter that checks other things too)."""
        answer = self._call("answer", {"id": request_id}).get("answer")
        return answer if isinstance(answer, dict) else None

    def forget(self, request_id: int) -> None:
        """The answer was read for the last time: the front lets it go."""
        self._call("forget", {"id": request_id})

    def say(self, request_id: int, answer: dict[str, Any]) -> None:
        """The front's answer to a request rank 0 handed on (a tune's outcome)."""
        self._call("say", {"id": request_id, "answer": answer})

    def tune(self, timeout_s: float, what: str = "bucket") -> dict[str, Any]:
        """`tune bucket|strategy`: rank 0 accepts it (or refuses: no buckets to tune, one rank, a sweep), the front's
        tuner answers with the outcome once its trials are done, or refuses (a tune already running)."""
        request_id = self.request("tune", {"what": what})
        deadline = time.monotonic() + timeout_s
        answer = self._await(request_id, deadline, lambda a: a.get("state") != "pending" or not a.get("ok"),
                             f"request {request_id}: the tune did not end within {timeout_s:g} s")
        if not answer.get("ok"):
            raise ControlError(f"refused: {answer.get('error')}" if answer.get("state") != "failed"
                               else f"tune {what} stopped: {answer.get('error')}")
        self.forget(request_id)
        return {"request_id": request_id, **answer}

    def send(self, op: str, changes: dict[str, Any] | None = None, wait_applied: bool = True,
             timeout_s: float = 30.0) -> dict[str, Any]:
        """Send and wait for rank 0's answer; for `set`, until every rank applied it (or `timeout_s`)."""
        request_id = self.request(op, changes)
        deadline = time.monotonic() + timeout_s
        answer = self._await(request_id, deadline, lambda answer: True, f"rank 0 did not answer within {timeout_s:g} s")
        if answer.get("state") == "rolled back":  # accepted and already undone before the first look (a slow client)
            raise ControlError(str(answer.get("error")))
        if not answer.get("ok"):
            raise ControlError(f"refused: {answer.get('error')}")
        accepted_step = answer.get("step")
        if op == "set" and wait_applied:
            answer = self._await(request_id, deadline, lambda a: a.get("state") in ("applied", "rolled back"),
                                 f"request {request_id} accepted but not applied within {timeout_s:g} s")
            if answer.get("state") == "rolled back":  # a batch that did not fit: the job trains on as before
                raise ControlError(str(answer.get("error")))
        if op != "set" or not wait_applied or answer.get("state") == "applied":
            self.forget(request_id)  # read for the last time
        return {"request_id": request_id, "accepted_step": accepted_step, **answer}

    def close(self) -> None:
        self.session.close()


def _decoded(steps: Any) -> dict[int, list[StepDone]]:
    out: dict[int, list[StepDone]] = {}
    for rank, items in (steps if isinstance(steps, dict) else {}).items():
        try:
            decoded = [event_from_dict(item) for item in items[:keys.MAX_RECENT]]
            out[int(rank)] = [e for e in decoded if isinstance(e, StepDone) and str(e.rank) == rank]
        except (EventDecodeError, TypeError, ValueError):
            continue
    return out


def _step(step: Any) -> dict[str, Any]:
    return {"step": step} if isinstance(step, int) and not isinstance(step, bool) and step >= 0 else {}


def _check_ended(word: Any, request_id: int) -> None:
    """The front's last word (Hub.ended), once the job's ranks are gone: raised as the wait's outcome."""
    if not isinstance(word, dict):
        return
    why = clean(str(word.get("why", "?")), 300)
    if word.get("lost"):
        raise PeerLost(f"a rank was lost while the request waited: {why}; request {request_id} was not applied")
    raise JobEnded(f"the job ended ({why}) while request {request_id} waited: it was not applied")


def _checked_status(status: dict[str, Any]) -> dict[str, Any]:
    """Types and ranges of rank 0's status, before anything loops over or prints them."""
    def whole(name: str, low: int, high: int) -> int:
        value = status.get(name)
        if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
            raise BadValue(f"{name} is not a whole number in {low}..{high}")
        return value

    whole("step", 0, keys.MAX_COUNTER)
    whole("segment", 0, keys.MAX_COUNTER)
    whole("world_size", 1, MAX_WORLD_SIZE)
    t, job, config = status.get("t"), status.get("job"), status.get("config")
    if not isinstance(t, (int, float)) or isinstance(t, bool) or not math.isfinite(t):
        raise BadValue("t is not a time")
    if not isinstance(job, str) or len(job) != 32 or any(c not in "0123456789abcdef" for c in job):
        raise BadValue("job is not a job id")
    if not isinstance(status.get("paused"), bool) or not isinstance(config, dict):
        raise BadValue("paused or config malformed")
    try:
        SyncConfig(**config)
    except (DdptopError, TypeError) as exc:
        raise BadValue(f"config: {exc}") from None
    return status
