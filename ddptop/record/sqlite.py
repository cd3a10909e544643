"""RecordingWriter: a sink that writes the event stream to one SQLite file from its own thread, batched.

The caller's `handle(events)` only appends to a queue; the writer thread commits a batch at least every
`commit_every_s` (0.5 s), in WAL mode with synchronous=NORMAL, so killing any process at any moment leaves a
file that opens with everything up to its last commit. `close()` folds the WAL back into the file and
switches it to a rollback journal, so a finished recording is one self-contained file.

A write that fails (disk full, I/O error) keeps every batch committed before it, marks the file
`recorder_error` (so it never reads as complete) and stops recording; the run goes on (`on_error` tells
the front, which shows it), unless the user asked for --record-required. So that a full disk still has
room for that mark, the writer keeps RESERVE bytes beside the file (FILE-reserve) and frees them first.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import queue
import sqlite3
import stat
import sys
import threading
import time
from contextlib import contextmanager
from typing import Any, Callable

import ddptop
from ddptop.errors import RecordingError, RecordingExists
from ddptop.events import SCHEMA_VERSION as EVENT_SCHEMA, ConfigApplied, Event, RankJoined, RunStarted, StepSpans, link_bits
from ddptop.record import schema
from ddptop.record.reader import Recording
from ddptop.safe import replacing

MAX_BATCH = 20000  # rows per transaction when the queue runs ahead of the commit clock
RESERVE = 256 * 1024  # room for the failure mark (a few WAL pages) once the disk is full
_STOP = object()


def base_meta(config: dict, rendezvous: dict, argv: list[str] | None = None) -> dict[str, Any]:
    """What a run knows before its ranks join; hosts, model and buckets are added as their events arrive."""
    meta = {"config": config, "rendezvous": rendezvous, "argv": redact(sys.argv if argv is None else argv),
            "versions": {"ddptop": ddptop.__version__, "python": platform.python_version(),
                         "torch": _version("torch"), "sqlite": sqlite3.sqlite_version},
            "created": time.time()}
    link = link_bits()
    if link is not None:  # only the lab knows the link's rate (the hints' "link at its rate")
        meta["link"] = {"bits_per_s": link, "by": "ddptop lab --link"}
    return meta


SECRET_FLAGS = ("--token",)


def redact(argv: list[str]) -> list[str]:
    """The command line without its secrets: a recording is shared (reports, course hand-ins), a job token is not."""
    out, hide = [], False
    for word in map(str, argv):
        flag, eq, _ = word.partition("=")
        if hide:
            out.append("REDACTED")
        elif eq and flag in SECRET_FLAGS:
            out.append(f"{flag}=REDACTED")
        else:
            out.append(word)
        hide = not hide and word in SECRET_FLAGS
    return out


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


class RecordingWriter:
    """`handle(events)` from any thread; `close()` once at the end (safe to call twice)."""

    def __init__(self, path: str, meta: dict[str, Any], commit_every_s: float = 0.5,
                 on_error: Callable[[str], None] | None = None, clock: str = "received"):
        """`clock` sets the rows' `at` (schema.py): "received", when `handle` got each batch (a live front); "events",
        the running maximum of the events' own times (a stream written at once: a test's, a rewritten recording)."""
        if clock not in ("received", "events"):
            raise ValueError(f"clock must be 'received' or 'events', not {clock!r}")
        self.path = path
        self.commit_every_s = commit_every_s
        self.error: str | None = None
        self.on_error = on_error  # called once, from the writer thread, with the reason
        self.written = 0  # events committed
        self.joined = 0  # RankJoined events given to it (written or not): none, and the run never started
        self._db = _create(path)
        self._reserve = _reserve(path)
        self._meta = dict(meta)
        self._seq = 0
        self._at: float | None = None
        self._clock = clock
        self._started = (time.time(), time.monotonic())  # the recording's start: `at` is wall time there + monotonic
        self._buckets: dict[str, list] = {}
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._closed = False
        try:
            with _transaction(self._db):
                self._db.executemany("INSERT INTO meta VALUES (?, ?)", [
                    ("format", schema._dumps(schema.FORMAT)), ("schema_version", str(schema.SCHEMA_VERSION)),
                    ("event_schema", str(EVENT_SCHEMA)), *((k, schema._dumps(v)) for k, v in self._meta.items())])
        except sqlite3.Error as exc:  # a disk that is already full: no file rather than an empty one
            self._db.close()
            _remove(path)
            _free(self._reserve)
            raise RecordingError(f"cannot record to {path}: {exc}") from None
        self._thread = threading.Thread(target=self._run, name="ddptop-recorder", daemon=True)
        self._thread.start()

    def handle(self, events: list[Event]) -> None:
        if events and not self._closed:
            # a run whose ranks joined keeps its file, even when the disk filled before their joins were written
            self.joined += sum(isinstance(e, RankJoined) for e in events)
            wall, mono = self._started
            received = wall + time.monotonic() - mono if self._clock == "received" else None
            self._queue.put([(received, e) for e in events])

    def close(self) -> None:
        """Write what is queued, fold the WAL into the file, close it. A failure is in `error` (never raised)."""
        if self._closed:
            return
        self._closed = True
        self._queue.put(_STOP)
        self._thread.join()
        try:
            if self.error is None:
                with _transaction(self._db):
                    self._db.execute("INSERT OR REPLACE INTO meta VALUES ('closed', ?)",
                                     (schema._dumps(time.time()),))
            self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            self._db.execute("PRAGMA journal_mode=DELETE")
        except sqlite3.Error as exc:
            if self.error is None:
                self._fail(str(exc))
        finally:
            self._db.close()
            _free(self._reserve)

    def discard(self) -> None:
        """Close and remove a recording no rank ever joined: a run that failed to start leaves no file, even when
        the front recorded what it saw (a rank 0 that gave up waiting for rank 1 is a `rank_lost` event)."""
        self.close()
        if self.joined == 0:
            _remove(self.path)

    def _run(self) -> None:
        pending: list[tuple[float | None, Event]] = []
        deadline = None
        while True:
            timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                item = self._queue.get(timeout=timeout)
            except queue.Empty:
                item = None
            if item is not None and item is not _STOP:
                pending.extend(item)
                deadline = deadline or time.monotonic() + self.commit_every_s
            due = deadline is not None and time.monotonic() >= deadline
            if pending and (due or item is _STOP or len(pending) >= MAX_BATCH):
                self._write(pending)
                pending, deadline = [], None
            if item is _STOP:
                return

    def _write(self, events: list[tuple[float | None, Event]]) -> None:
        if self.error:
            return
        try:
            rows, meta, segments = self._encode(events)
            with _transaction(self._db):
                for table, table_rows in rows.items():
                    if table_rows:
                        self._db.executemany(schema.INSERT[table], table_rows)
                for rank0, row in segments:  # rank 0's switch is the one screens follow: it wins, others fill in
                    self._db.execute(f"INSERT OR {'REPLACE' if rank0 else 'IGNORE'} INTO segments VALUES (?, ?, ?, ?, ?)",
                                     row)
                self._db.executemany("INSERT OR REPLACE INTO meta VALUES (?, ?)",
                                     [(k, schema._dumps(v)) for k, v in meta.items()])
        except (sqlite3.Error, OSError, OverflowError, ValueError, TypeError) as exc:  # disk full, I/O error
            self._fail(str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
            return
        self.written += len(events)

    def _fail(self, reason: str) -> None:
        """Stop recording: mark the file (a small row that usually still fits: the WAL reuses its pages after a
        checkpoint) so no reader calls it complete; if even that fails, it lacks 'closed' and reads incomplete."""
        self.error = reason
        _free(self._reserve)
        try:
            with _transaction(self._db):
                self._db.execute("INSERT OR REPLACE INTO meta VALUES ('recorder_error', ?)", (schema._dumps(reason),))
        except sqlite3.Error:
            pass
        if self.on_error is not None:
            self.on_error(reason)
        else:
            print(f"ddptop: recording to {self.path} stopped: {reason}", file=sys.stderr, flush=True)

    def _encode(self, events: list[tuple[float | None, Event]]) -> tuple[dict[str, list[tuple]], dict[str, Any],
                                                                          list[tuple]]:
        rows: dict[str, list[tuple]] = {table: [] for table in schema.TABLES}
        meta: dict[str, Any] = {}
        segments = []
        for received, event in events:
            # live, never a rank's clock: one rank's skewed or bogus `t` would shift every later row of every rank
            t = received if received is not None else schema.event_time(event)
            if t is not None:
                self._at = t if self._at is None else max(self._at, t)
            self._seq += 1
            table, row = schema.encode(event, self._seq, self._at if self._at is not None else 0.0)
            rows[table].append(row)
            segments.extend(self._note(event, meta))
        return rows, meta, segments

    def _note(self, event: Event, meta: dict[str, Any]) -> list[tuple]:
        """Run metadata carried by events: hosts and versions, the model, segments, DDP bucket layout."""
        if isinstance(event, RankJoined):
            ranks = self._meta.setdefault("ranks", {})
            ranks[str(event.rank)] = {k: v for k, v in event.to_dict().items() if k not in ("kind", "v", "rank")}
            meta["ranks"] = ranks
            meta["hosts"] = sorted({r["host"] for r in ranks.values()})
        elif isinstance(event, RunStarted):
            meta["model"] = {k: v for k, v in event.to_dict().items() if k not in ("kind", "v")}
        elif isinstance(event, ConfigApplied):
            return [(event.rank == 0, (event.segment, event.step, event.t, self._at, schema._dumps(event.config)))]
        elif isinstance(event, StepSpans) and event.rank == 0:
            buckets = [[s.name, s.nbytes] for s in event.spans if s.kind == "comm" and s.name.startswith("bucket ")]
            # DDP rebuilds its buckets after the first step (one 36.9 MB bucket, then 28.3 + 8.6 MB for VGG-11):
            # keep the newest layout of each segment
            if buckets and self._buckets.get(str(event.segment)) != buckets:
                self._buckets[str(event.segment)] = buckets
                meta["ddp_buckets"] = self._buckets
        return []


def _create(path: str) -> sqlite3.Connection:
    """A new, empty recording at `path`; an existing file is never overwritten (remove it first). The file is
    created exclusively (O_EXCL), so of two runs that picked one name at once exactly one gets it."""
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise RecordingError(f"cannot record to {path}: no folder {folder}")
    _nothing_beside(path)
    try:  # O_EXCL never follows a link at `path`; O_NOFOLLOW says so once more
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644))  # an empty database
    except FileExistsError:
        what = "a ddptop recording" if _is_recording(path) else "not a ddptop recording"
        raise RecordingExists(f"{path} already exists ({what}): remove it or record to another file") from None
    except OSError as exc:
        raise RecordingError(f"cannot record to {path}: {exc.strerror or exc}") from None
    db = None
    try:
        db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")  # with WAL: durable against any process crash, not power loss
        db.executescript("BEGIN;" + schema.DDL + "COMMIT;")
    except sqlite3.Error as exc:
        if db is not None:
            db.close()
        _remove(path)  # a failed start leaves no file
        raise RecordingError(f"cannot record to {path}: {exc}") from None
    return db


@contextmanager
def _transaction(db: sqlite3.Connection):
    """One explicit transaction (the connection is in autocommit mode, so nothing commits behind our back)."""
    db.execute("BEGIN")
    try:
        yield
    except BaseException:
        db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")


def _is_recording(path: str) -> bool:
    try:
        Recording.open(path).close()
        return True
    except RecordingError:
        return False


def _remove(path: str) -> None:
    for name in (path, path + "-wal", path + "-shm", path + "-journal", path + "-reserve"):
        try:
            os.unlink(name)
        except OSError:
            pass


def _nothing_beside(path: str) -> None:
    """SQLite opens FILE-wal and FILE-shm beside a recording as it finds them: one already there (planted by someone
    who may write the folder, or left by a crash) would be read as this new file's log, or refused in SQLite's
    words. Refused first, in one line naming it (RecordingError, exit 6); nothing is removed or followed. When the
    recording itself exists, another run took the name (its -journal may be beside it already: two jobs started in
    one second in one runs folder, a CI run): RecordingExists, so a name ddptop chose becomes the next free one."""
    if os.path.lexists(path):
        what = "a ddptop recording" if _is_recording(path) else "not a ddptop recording"
        raise RecordingExists(f"{path} already exists ({what}): remove it or record to another file")
    for side in ("-wal", "-shm", "-journal"):
        try:
            st = os.lstat(path + side)
        except FileNotFoundError:
            continue
        except OSError as exc:
            raise RecordingError(f"cannot record to {path}: {path + side}: {exc.strerror or exc}") from None
        what = "a link" if stat.S_ISLNK(st.st_mode) else "a file"
        raise RecordingError(f"cannot record to {path}: {path + side} is in the way ({what} of uid {st.st_uid}; "
                             "SQLite would use it): remove it or record to another file")


def _reserve(path: str) -> str | None:
    """RESERVE bytes beside the recording, given back when a write fails so the failure can still be written.
    Written as a fresh file and renamed onto FILE-reserve (safe.replacing): a link planted there is replaced."""
    reserve = path + "-reserve"
    try:
        with replacing(reserve, "wb", perms=0o600) as f:
            f.write(b"\0" * RESERVE)
    except OSError:
        return None
    return reserve


def _free(reserve: str | None) -> None:
    if reserve is not None:
        try:
            os.unlink(reserve)
        except OSError:
            pass
