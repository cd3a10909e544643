"""The one error hierarchy: every user-facing failure is a DdptopError with an exit code."""

import os
import re
import sys


class DdptopError(Exception):
    """A failure the user can act on: cli.main prints its message on one line and exits with `exit_code`."""

    exit_code = 1


class UsageError(DdptopError):
    """Bad flags, values or names."""

    exit_code = 2


class JobStopped(DdptopError):
    """`ddptop ctl stop` reached a user's own loop (ddptop/api.py) that entered another step anyway."""

    exit_code = 0


class DataError(DdptopError):
    """A data set that cannot be found or read."""

    exit_code = 3


class RendezvousError(DdptopError):
    """Ranks could not find each other: unreachable master, port in use, mismatched world size or version."""

    exit_code = 4


class PeerLost(DdptopError):
    """A rank or the master went away mid-run."""

    exit_code = 5


class RecordingError(DdptopError):
    """A recording that cannot be read or written."""

    exit_code = 6


class RecordingExists(RecordingError):
    """The file a recording would be created at exists (ddptop never overwrites one)."""


class OutputClosed(DdptopError):
    """stdout's reader went away (`ddptop … | head -3`): the run ends as `yes | head` does, 128 + SIGPIPE."""

    exit_code = 141


class LabUnavailable(DdptopError):
    """`ddptop lab` cannot build its cluster here: not root, no namespaces, tc or cgroup CPU controller."""

    exit_code = 2


def say_line(text: str) -> None:
    """One line on this process's own stderr in one write(2): ranks sharing a pipe never interleave mid-line.

    print() writes the text and its newline separately; two ranks failing together then wrote
    "ddptop rank 1: ...ddptop rank 0: ..." on one line (a CI run, 2026-11-27). A pipe keeps a write of up to
    PIPE_BUF (4096) bytes whole, so the line is cut to fit.
    """
    data = (text.replace("\n", " ")[:4000] + "\n").encode("utf-8", "replace")
    try:
        sys.stderr.flush()
    except (OSError, ValueError):
        pass
    try:
        os.write(2, data)
    except OSError:
        pass


USER_FILES: set[str] = set()  # the files of the user's code (--model/--dataset/--loss/--collate), as train.specs loads it


def user_code_line(exc: BaseException) -> str | None:
    """For an exception raised inside the user's own code while training (a collate function that fails on batch 7,
    a model that raises on some input): where in that code, and what, as one line; None when the innermost frame of
    the user's files is not in its traceback (then it is ddptop's or torch's: an internal error). Raised in a
    DataLoader worker process, torch raises it again in the rank with the worker's traceback only as text in its
    message ("Caught ValueError in DataLoader worker process 0.\nOriginal Traceback ..."): read from there."""
    import traceback

    from ddptop.safe import clean

    frames = [(f.filename, f.lineno, f.name) for f in traceback.extract_tb(exc.__traceback__)]
    kind, text = type(exc).__name__, (str(exc).strip().splitlines() or [""])[0]
    if not _mine(frames):
        frames, kind, text = _wrapped(str(exc)) or (frames, kind, text)
    frames = _mine(frames)
    if not frames:
        return None
    path, lineno, function = frames[-1]
    text = text[:200]
    return clean(f"your code raised at {os.path.basename(path)}:{lineno} in {function}: "
                 f"{kind}{': ' + text if text else ''}")


def _mine(frames: list[tuple[str, int | None, str]]) -> list[tuple[str, int | None, str]]:
    return [f for f in frames if os.path.abspath(f[0]) in USER_FILES]


# torch._utils.ExceptionWrapper.reraise: the worker's exception, formatted by traceback.format_exception
_WRAPPED = "Original Traceback (most recent call last):"
_FRAME = re.compile(r'^  File "(.+)", line (\d+), in (.+)$')
_LAST = re.compile(r"^(\w[\w.]*)(?:: (.*))?$")


def _wrapped(message: str) -> tuple[list[tuple[str, int | None, str]], str, str] | None:
    """The frames, exception name and first message line of the last traceback in a loader worker's re-raised
    exception's message (the last: a chained exception's first traceback is the one it was raised during)."""
    if _WRAPPED not in message:
        return None
    lines = message.split(_WRAPPED, 1)[1].splitlines()
    starts = [i for i, line in enumerate(lines) if line == "Traceback (most recent call last):"]
    lines = lines[starts[-1] + 1:] if starts else lines
    found = [(i, m) for i, m in enumerate(map(_FRAME.match, lines)) if m]
    if not found:
        return None
    frames = [(m[1], int(m[2]), m[3]) for _, m in found]
    # the exception's line: the first after the last frame that is not that frame's code (indented)
    said = next((line for line in lines[found[-1][0] + 1:] if line and not line.startswith(" ")), "")
    last = _LAST.match(said)
    if last is None:
        return None
    return frames, last[1].rsplit(".", 1)[-1], (last[2] or "").strip()
