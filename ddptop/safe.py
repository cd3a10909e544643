"""Terminal-safe text: control characters and escape sequences from the store or a recording never reach a screen.

Strings in events, recordings and store values can come from anyone who reaches the store's port or hands
over a file. Printed raw, `\\x1b]0;...` retitles the terminal, `\\x1b[2J` clears it and bidi overrides make a
line read differently from what it holds. Every such character is shown escaped (`\\x1b`) instead; text is
decoded once (events.event_from_dict, the recording's meta) and every printer cleans its lines again.

Also `read_text`: a kernel file (a cgroup's limits, /proc) read whole, where it may be missing or unreadable; and
`replacing`: a file written in a folder another user may write (a shared /tmp, a group's folder) without ever
following a link or opening a file someone planted there.
"""

from __future__ import annotations

import contextlib
import os
import re
from typing import IO, Any, Iterator

# C0 and C1 controls, DEL, zero-width and bidi controls, BOM, lone surrogates (undecodable bytes)
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff\ud800-\udfff]")
MAX_DEPTH = 32


def _escape(match: re.Match) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def clean(text: Any, limit: int | None = None) -> str:
    """One line with every control character escaped; cut to `limit` characters (with …) when given."""
    out = _UNSAFE.sub(_escape, text if isinstance(text, str) else str(text))
    if limit is not None and len(out) > limit:
        out = out[: max(0, limit - 1)] + "…"
    return out


def clean_lines(text: str) -> str:
    """Text of several lines that ddptop composed: each line cleaned, the line breaks kept."""
    return "\n".join(clean(line) for line in text.split("\n"))


def clean_value(value: Any, depth: int = 0) -> Any:
    """Every string in a decoded JSON value (dict keys included) cleaned; numbers and the shape unchanged."""
    if isinstance(value, str):
        return clean(value) if _UNSAFE.search(value) else value
    if depth > MAX_DEPTH:
        raise ValueError("value nested too deeply")
    if isinstance(value, dict):
        return {clean_value(k, depth + 1): clean_value(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list):
        return [clean_value(v, depth + 1) for v in value]
    if isinstance(value, tuple):
        return tuple(clean_value(v, depth + 1) for v in value)
    return value


def read_text(path: str) -> str:
    """The file's text, or "" when it cannot be read (no such cgroup controller, a process gone, no permission):
    the one rule for the system sampler's and the lab's cgroup and /proc files."""
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


@contextlib.contextmanager
def replacing(path: str | os.PathLike, mode: str = "w", perms: int = 0o644, **kwargs: Any) -> Iterator[IO]:
    """Write PATH whole or not at all, safely in a folder others may write: the content goes to a fresh file beside
    it (tempfile.mkstemp: O_CREAT|O_EXCL|O_NOFOLLOW, a random name nobody could plant beforehand), which is renamed
    onto PATH once complete; a link planted at PATH is replaced, never written through. `perms` (less the umask; 0o600
    as given) is the file's mode. On any failure the partial is removed and the error raised."""
    path = os.fspath(path)
    folder, name = os.path.split(os.path.abspath(path))
    import tempfile  # here, not at the top: every command imports this module, few write a file

    fd, partial = tempfile.mkstemp(prefix=f".{name[:100]}.", suffix=".part", dir=folder)
    try:
        with os.fdopen(fd, mode, **kwargs) as f:
            os.fchmod(fd, perms if perms == 0o600 else perms & ~_umask())
            yield f
        os.replace(partial, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(partial)
        raise


def _umask() -> int:
    """This process's umask, read without changing it (os.umask sets it, for every thread at once)."""
    for line in read_text("/proc/self/status").splitlines():
        if line.startswith("Umask:"):
            return int(line.split()[1], 8)
    return 0o022
