"""Provides where a run records by default (a new file in ./ddptop-runs/), the checks before it, and the lines that
say where it went."""

from __future__ import annotations

import os
import re
import time

from ddptop.config import DEFAULT_RUNS_DIR as DEFAULT_DIR, RUNS_DIR_ENV  # noqa: F401 (defined there for train)
from ddptop.errors import UsageError


def default_path(what: str, folder: str | None = None, now: float | None = None) -> str:
    """`ddptop-runs/20250301-142233-ddp.db`, with -2, -3 … when a run started in the same second."""
    folder = folder or os.environ.get(RUNS_DIR_ENV) or DEFAULT_DIR
    stem = f"{time.strftime('%Y%m%d-%H%M%S', time.localtime(now))}-{''.join(c for c in what if c.isalnum() or c in '-_')}"
    path, n = os.path.join(folder, stem + ".db"), 2
    while os.path.lexists(path):
        path, n = os.path.join(folder, f"{stem}-{n}.db"), n + 1
    return path


def another(path: str) -> str:
    """The next free name after a default one another run took: `…-ddp.db` → `…-ddp-2.db` → `…-ddp-3.db`."""
    stem = path[:-3] if path.endswith(".db") else path
    match = re.fullmatch(r"(.*\d{8}-\d{6}-.*?)-(\d+)", stem)
    base, n = (match.group(1), int(match.group(2)) + 1) if match else (stem, 2)
    while os.path.lexists(f"{base}-{n}.db"):
        n += 1
    return f"{base}-{n}.db"


def choose(record: str | None, no_record: bool, what: str) -> str | None:
    """The file this run records to: --record FILE, else a new one in the runs folder (made here), or None."""
    if no_record:
        if record:
            raise UsageError("--record and --no-record contradict each other: give one")
        return None
    if record:
        return record
    path = default_path(what)
    try:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    except OSError as exc:
        raise UsageError(f"cannot create the runs folder {os.path.dirname(path)}: {exc.strerror or exc} "
                         f"(--record FILE names another place, --no-record turns recording off)") from None
    return path


def check_new(path: str) -> None:
    """A recording never overwrites anything: refused before any rank starts."""
    if os.path.lexists(path):
        raise UsageError(f"--record {path}: the file exists; ddptop never overwrites a recording")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise UsageError(f"--record {path}: no folder {folder}")
    if not os.access(folder, os.W_OK):
        raise UsageError(f"--record {path}: cannot write in {folder}")


def shown(path: str) -> str:
    """A path as short as it can be said: relative to the current folder when it is inside it."""
    try:
        rel = os.path.relpath(path)
    except ValueError:
        return path
    return rel if not rel.startswith("..") else path


def report_dir(path: str) -> str:
    stem = path[:-3] if path.endswith(".db") else path
    return stem + "-report"


def closing_lines(path: str, steps: int, ranks: int) -> list[str]:
    """What a run prints when it ends: where its recording is, what the FILE holds (counted there: after a full disk
    it holds fewer steps than the run trained), and what to do with it."""
    held, held_ranks, why = file_steps(path)
    path = shown(path)
    if why:
        return [f"recorded to {path}, which cannot be read: {why}"]
    if held <= 0:
        return [f"recorded no training steps to {path}" + (f" (the run trained {steps})" if steps > 0 else "")]
    short = f" (the run trained {steps}: the file stops early)" if held < steps else ""
    return [f"recorded {held} step{'s' if held != 1 else ''} of {held_ranks} rank{'s' if held_ranks != 1 else ''} "
            f"to {path}{short}",
            f"  make a report: ddptop report {path} -o {report_dir(path)}"]


def file_steps(path: str) -> tuple[int, int, str]:
    """(steps, ranks) the recording at `path` holds, counted in the file; or a reason it cannot be read."""
    from ddptop.errors import DdptopError
    from ddptop.record.reader import Recording

    try:
        with Recording.open(path) as rec:
            steps, ranks = rec.query("SELECT count(DISTINCT step), count(DISTINCT rank) FROM steps")[0]
    except DdptopError as exc:
        return 0, 0, str(exc)
    return steps, ranks, ""
