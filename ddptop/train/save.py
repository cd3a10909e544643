"""`--save FILE`: the name checked before training, the model written at the end without following a link.

The model is serialized in memory first, written to a new temporary file beside FILE (O_EXCL | O_NOFOLLOW),
fsync'ed, then renamed onto FILE: rename(2) replaces a link planted at FILE during the run instead of writing
through it (as root the old torch.save(FILE) overwrote the link's target). When that fails at the end (a full
disk, an I/O error), the model is written to the runs folder or the temporary folder instead and the run says
where, in one line (exit 6), instead of an exit 70 with a C++ "enforce fail" after the whole run.
"""

from __future__ import annotations

import io
import os
import tempfile
import time

from ddptop.config import DEFAULT_RUNS_DIR, RUNS_DIR_ENV
from ddptop.errors import DdptopError, UsageError

NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)


class SaveFailed(DdptopError):
    """--save could not write FILE at the end; the message says where the model was kept instead."""

    exit_code = 6  # README: "a recording or --save file that cannot be read or written"


def check_target(path: str) -> str:
    """--save FILE before any rank starts: FILE must not exist and a file must be creatable in its folder (a probe
    file is made and removed: catches a read-only disk, a folder such as /proc/self, missing rights)."""
    full = os.path.abspath(path)
    folder = os.path.dirname(full)
    if os.path.lexists(full):
        raise UsageError(f"--save {path}: the file exists; remove it or save to another file")
    if not os.path.isdir(folder):
        raise UsageError(f"--save {path}: no folder {folder}")
    probe = os.path.join(folder, f".{os.path.basename(full)}.{os.getpid()}.probe")
    try:
        os.close(os.open(probe, NEW_FILE, 0o600))
        os.unlink(probe)
    except OSError as exc:
        raise UsageError(f"--save {path}: cannot write in {folder}: {exc.strerror or exc}") from None
    return full


def save(state: dict, path: str) -> None:
    """torch.save(state) to `path` through a temporary file and a rename; SaveFailed (the model kept elsewhere)."""
    import torch

    buffer = io.BytesIO()
    torch.save(state, buffer)
    data = buffer.getbuffer()
    folder, name = os.path.split(path)
    temporary = os.path.join(folder, f".{name}.{os.getpid()}.tmp")
    try:
        _write_new(temporary, data)
    except OSError as exc:
        raise SaveFailed(f"--save {path} failed ({exc.strerror or exc}); {_keep(data, name)}") from None
    try:
        os.replace(temporary, path)  # renames over a planted link or file; never writes through it
        _sync_folder(folder)
    except OSError as exc:
        _remove(temporary)
        raise SaveFailed(f"--save {path} failed ({exc.strerror or exc}); {_keep(data, name)}") from None


def _write_new(path: str, data) -> None:
    """A new file holding `data`, on disk; a file left half-written by a failure is removed (never another's)."""
    fd = os.open(path, NEW_FILE, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)  # on disk before the rename makes it the file: a crash leaves the old name or the whole model
    except OSError:
        _remove(path)
        raise
    finally:
        os.close(fd)


def _keep(data, name: str) -> str:
    """Write the model where it can still go: the runs folder, else the temporary folder; say where."""
    stem = f"ddptop-saved-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}-{name}"
    for folder in (os.environ.get(RUNS_DIR_ENV) or DEFAULT_RUNS_DIR, tempfile.gettempdir()):
        kept = os.path.abspath(os.path.join(folder, stem))
        try:
            _write_new(kept, data)
            return f"the model is kept at {kept}"
        except OSError:
            continue
    return "the model could not be kept anywhere (runs folder and temporary folder failed too)"


def _sync_folder(folder: str) -> None:
    fd = os.open(folder or ".", os.O_RDONLY)
    try:
        os.fsync(fd)  # the rename itself on disk
    finally:
        os.close(fd)


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
