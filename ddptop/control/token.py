"""The job token: where it comes from, and the per-job file local clients find it (and the job) in."""

from __future__ import annotations

import json
import os
import re
import secrets
import stat
import time
from pathlib import Path
from typing import Any

from ddptop.control.auth import token_bytes
from ddptop.errors import UsageError
from ddptop.safe import replacing

TOKEN_ENV = "DDPTOP_TOKEN"
MIN_TOKEN_BYTES = 8
STRONG_TOKEN_BYTES = 16  # a typed token shorter than this gets a warning at start (scrypt slows a guess, no more)
MAX_TOKEN_BYTES = 1024
MAX_JOB_FILE_BYTES = 64 * 1024
ENDED_KEPT_S = 7 * 86400  # a note that a job ended is kept a week (one small file per job), then removed


def jobs_dir() -> Path:
    base = os.environ.get("DDPTOP_STATE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "ddptop", "jobs")
    return Path(base)


def private_jobs_dir(create: bool = True) -> Path | None:
    """The state folder (DDPTOP_STATE_DIR, else ~/.cache/ddptop/jobs), made 0700 when ddptop creates it; None when it
    does not exist and `create` is false. Job files hold tokens: a folder that another user owns or that others may
    enter (any mode but 0700) is refused in one line (UsageError, exit 2), never used as it is."""
    folder = jobs_dir()
    made = False
    if create and not folder.exists():
        try:
            folder.mkdir(parents=True, mode=0o700)
            made = True
        except FileExistsError:
            pass
        except OSError as exc:
            raise UsageError(f"cannot create the state folder {folder}: {exc.strerror or exc}") from None
    try:
        if made:
            folder.chmod(0o700)  # mkdir's mode went through the umask
        st = folder.stat()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise UsageError(f"cannot use the state folder {folder}: {exc.strerror or exc}") from None
    problem = ("not a folder" if not stat.S_ISDIR(st.st_mode) else
               f"owned by uid {st.st_uid}, not you (uid {os.geteuid()})" if st.st_uid != os.geteuid() else
               f"mode {stat.S_IMODE(st.st_mode):04o}, not 0700" if stat.S_IMODE(st.st_mode) != 0o700 else "")
    if problem:
        raise UsageError(f"the state folder {folder} is {problem}: ddptop keeps job tokens there, so it must be "
                         f"yours alone (chmod 700 it, or set DDPTOP_STATE_DIR to a folder of your own)")
    return folder


def check_token(token: str, where: str = "the job token") -> str:
    """A token of 8 to 1024 bytes; any bytes (a token typed with bytes that are not UTF-8 keeps them)."""
    size = len(token_bytes(token))
    if not MIN_TOKEN_BYTES <= size <= MAX_TOKEN_BYTES:
        raise UsageError(f"{where} must be {MIN_TOKEN_BYTES} to {MAX_TOKEN_BYTES} bytes long, got {size}")
    return token


def resolve_token(given: str | None) -> tuple[str, bool]:
    """(token, user_given): --token, then DDPTOP_TOKEN, else a fresh random one."""
    if given is not None:
        return check_token(given, "--token"), True
    env = os.environ.get(TOKEN_ENV)
    if env:
        return check_token(env, TOKEN_ENV), True
    return secrets.token_hex(16), False


def job_file(master: str, port: int) -> Path:
    """One file per (address, port): two jobs on one port at two local addresses never share a file."""
    return jobs_dir() / f"{re.sub(r'[^A-Za-z0-9.-]', '_', master)[:100]}_{port}.json"


def write_job_file(master: str, port: int, token: str, world_size: int, prefix: str = "") -> Path:
    """A file only this user can read, so `ddptop ctl` and the UI on this machine find the job and its token."""
    private_jobs_dir()
    path = job_file(master, port)
    with replacing(path, perms=0o600) as f:  # readers never see half a file; nothing planted is written through
        json.dump({"master": master, "port": port, "token": token, "world_size": world_size, "pid": os.getpid(),
                   "prefix": prefix}, f)
    return path


def remove_job_file(master: str, port: int, how: str | None = None) -> None:
    """Remove this process's job file, never another job's. With `how` (the job's end, in words) it becomes a note
    that the job ended, without the token (nothing is left to control), so `ddptop ctl` run after the job says that
    the job ended and how, not that no job ever ran (issue 26)."""
    path = job_file(master, port)
    job = _read(path)
    if job is None or job.get("pid") != os.getpid():
        return
    if how is None:
        path.unlink(missing_ok=True)
        return
    with replacing(path, perms=0o600) as f:
        json.dump({"master": master, "port": port, "pid": os.getpid(), "ended": time.time(), "how": " ".join(how.split())[:300]}, f)


def last_ended_job(master: str | None, port: int | None, folder: Path | None = None) -> dict[str, Any] | None:
    """The newest note of a job that ended here (at `master`/`port` when given; in `folder`, default the jobs
    folder); notes older than ENDED_KEPT_S go."""
    newest = None
    folder = folder or private_jobs_dir(create=False)
    for path in sorted(folder.glob("*.json")) if folder is not None and folder.is_dir() else []:
        note = _read_ended(path)
        if note is None:
            continue
        if time.time() - note["ended"] > ENDED_KEPT_S:
            path.unlink(missing_ok=True)
        elif ((port is None or note["port"] == port) and (master is None or note.get("master") == master)
              and (newest is None or note["ended"] > newest["ended"])):
            newest = note
    return newest


def _read_ended(path: Path) -> dict[str, Any] | None:
    try:
        if path.stat().st_size > MAX_JOB_FILE_BYTES:
            return None
        note = json.loads(path.read_text(errors="surrogateescape"))
    except (OSError, ValueError):
        return None
    if (not isinstance(note, dict) or "token" in note or not isinstance(note.get("port"), int)
            or not isinstance(note.get("ended"), (int, float)) or not isinstance(note.get("how"), str)):
        return None
    return note


def _read(path: Path) -> dict[str, Any] | None:
    try:
        if path.stat().st_size > MAX_JOB_FILE_BYTES:
            return None
        job = json.loads(path.read_text(errors="surrogateescape"))
    except (OSError, ValueError):
        return None
    if not isinstance(job, dict) or not isinstance(job.get("port"), int) or not isinstance(job.get("token"), str):
        return None
    return job


def _alive(pid: Any) -> bool:
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except PermissionError:  # EPERM: it runs, as another user (its job file is not ours to remove)
        return True
    except OSError:
        return False
    return True


def running_jobs() -> list[dict[str, Any]]:
    """Job files of jobs whose front process still runs (stale files are removed)."""
    found = []
    folder = private_jobs_dir(create=False)
    for path in sorted(folder.glob("*.json")) if folder is not None and folder.is_dir() else []:
        job = _read(path)
        if job is not None and _alive(job.get("pid")):
            found.append(job)
        elif job is not None:
            path.unlink(missing_ok=True)
    return found


def find_job(master: str | None, port: int | None) -> dict[str, Any] | None:
    """The running job at `master`/`port` (either may be None: any); several matches is a UsageError."""
    jobs = [j for j in running_jobs() if (port is None or j.get("port") == port)
            and (master is None or j.get("master") == master)]
    if len(jobs) > 1:
        where = ", ".join(f"{j.get('master')}:{j.get('port')}" for j in jobs)
        pick = "--master" if port is not None else "--port (and --master)"
        raise UsageError(f"several ddptop jobs run on this machine ({where}): pick one with {pick}")
    return jobs[0] if jobs else None
