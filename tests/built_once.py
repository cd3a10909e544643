"""A session fixture's product built once per `make test`, not once per pytest-xdist worker: each worker runs its
own session fixtures, so a recording that test files on both workers use (the smoke sweep: ~60 s of a 2-rank job)
was made twice. The first worker to ask builds it under a file lock; the other waits for the lock and reads it."""

from __future__ import annotations

import fcntl
import os
import pickle
import shutil
from pathlib import Path
from typing import Callable, TypeVar

T = TypeVar("T")


def built_once(tmp_path_factory, name: str, build: Callable[[Path], T]) -> T:
    """`build(folder)` once for the whole run (all workers), in a folder every worker can read; its result pickled.
    A build that fails leaves nothing: the next worker to ask builds again and fails on its own."""
    base = tmp_path_factory.getbasetemp()
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base  # the run's folder, above each worker's
    folder, done = root / f"once-{name}", root / f"once-{name}.pickle"
    with open(root / f"once-{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, even if build raises
        if done.exists():
            return pickle.loads(done.read_bytes())
        shutil.rmtree(folder, ignore_errors=True)  # what a failed build left (a recording is never overwritten)
        folder.mkdir()
        value = build(folder)
        done.write_bytes(pickle.dumps(value))
        return value
