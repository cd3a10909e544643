"""The job token: where it comes from, the per-job file local clients find it in, and MACs made with it."""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
from pathlib import Path
from typing import Any

from ddptop.errors import UsageError

TOKEN_ENV = "DDPTOP_TOKEN"


def jobs_dir() -> Path:
    base = os.environ.get("DDPTOP_STATE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "ddptop", "jobs")
    return Path(base)


def resolve_token(given: str | None) -> tuple[str, bool]:
    """(token, user_given): --token, then DDPTOP_TOKEN, else a fresh random one."""
    token = given or os.environ.get(TOKEN_ENV)
    if token:
        if len(token) < 8:
            raise UsageError("the job token must be at least 8 characters")
        return token, True
    return secrets.token_hex(16), False


def mac(token: str, payload: dict[str, Any]) -> str:
    body = json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()
    return hmac.new(token.encode(), body, hashlib.sha256).hexdigest()


def verify(token: str, payload: dict[str, Any], signature: Any) -> bool:
    return isinstance(signature, str) and hmac.compare_digest(mac(token, payload), signature)


def write_job_file(master: str, port: int, token: str, world_size: int, prefix: str = "") -> Path:
    """A file only this user can read, so `ddptop ctl` and the UI on this machine find the job and its token."""
    folder = jobs_dir()
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = folder / f"{port}.json"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump({"master": master, "port": port, "token": token, "world_size": world_size, "pid": os.getpid(),
                   "prefix": prefix}, f)
    return path


def _alive(pid: Any) -> bool:
    try:
        os.kill(int(pid), 0)
    except (OSError, ValueError, TypeError):
        return False
    return True


def running_jobs() -> list[dict[str, Any]]:
    """Job files of jobs whose front process still runs (stale files are removed)."""
    found = []
    folder = jobs_dir()
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        try:
            job = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(job, dict) and _alive(job.get("pid")):
            found.append(job)
        else:
            path.unlink(missing_ok=True)
    return found


def find_job(port: int | None) -> dict[str, Any] | None:
    jobs = running_jobs()
    if port is not None:
        return next((j for j in jobs if j.get("port") == port), None)
    if len(jobs) > 1:
        ports = ", ".join(str(j.get("port")) for j in jobs)
        raise UsageError(f"several ddptop jobs run on this machine (ports {ports}): pick one with --port")
    return jobs[0] if jobs else None


def remove_job_file(port: int) -> None:
    (jobs_dir() / f"{port}.json").unlink(missing_ok=True)
