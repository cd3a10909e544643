"""Recording: a read-only view of a recording file with indexed queries by step and time; never imports torch.

Every failure to read (a missing, empty, truncated, damaged or foreign file, a newer schema) is a
RecordingError with one line; nothing in a file is executed or unpickled (typed columns and JSON).
"""

from __future__ import annotations

import dataclasses
import errno
import heapq
import json
import math
import os
import sqlite3
import stat
from collections import Counter
from pathlib import Path
from typing import Any, Iterator

from ddptop.errors import RecordingError
from ddptop.events import SCHEMA_VERSION as EVENT_SCHEMA, LINK_BY, ClockSync, Event, EventDecodeError, SystemSample
from ddptop.record import schema
from ddptop.safe import clean, clean_value

SQLITE_MAGIC = b"SQLite format 3\x00"
# what reading a damaged file can raise: SQLite (malformed pages, missing tables), JSON and text decoding
# (ValueError, UnicodeDecodeError), our own checks (EventDecodeError), numbers too large, nesting too deep. Not
# TypeError, KeyError, AttributeError or IndexError: those are ddptop's bugs, and say so (exit 70), not "damaged"
DAMAGE = (sqlite3.DatabaseError, ValueError, OverflowError, RecursionError, EventDecodeError)


def check_file(path: str) -> None:
    """Refuse what is plainly not a recording before SQLite sees it (a FIFO or a device would block or never end)."""
    if not os.path.lexists(path):
        raise RecordingError(f"no such recording: {path}")
    try:
        # O_NONBLOCK: a FIFO swapped in after the check opens at once instead of waiting for a writer forever
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
    except OSError as exc:
        if exc.errno == errno.ENXIO:  # a socket, or a device without its driver: open(2) refuses them so
            raise RecordingError(f"{path} is {_kind_of(path)}, not a recording") from None
        raise RecordingError(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise RecordingError(f"{path} is {_kind(mode)}, not a recording")
        header = os.pread(fd, 100, 0)
    except OSError as exc:
        raise RecordingError(f"cannot read {path}: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    if not header:
        raise RecordingError(f"{path} is empty: not a ddptop recording")
    if not header.startswith(SQLITE_MAGIC) or len(header) < 100:
        raise RecordingError(f"{path} is not a ddptop recording (not an SQLite file)")
    _check_length(path, header)


def _kind_of(path: str) -> str:
    try:
        return _kind(os.stat(path).st_mode)
    except OSError:
        return "not a regular file"


def _kind(mode: int) -> str:
    """What a file that is not a regular one is, in words."""
    kinds = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a named pipe (FIFO)"), (stat.S_ISSOCK, "a socket"),
             (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))
    return next((word for test, word in kinds if test(mode)), "not a regular file")


def _check_length(path: str, header: bytes) -> None:
    """A file shorter than its header says was cut short (copied while written, truncated on disk)."""
    wal = path + "-wal"
    if os.path.exists(wal) and os.path.getsize(wal) > 0:
        return  # pages may still live in the WAL; SQLite checks those itself
    page_size = int.from_bytes(header[16:18], "big")
    page_size = 65536 if page_size == 1 else page_size
    pages = int.from_bytes(header[28:32], "big")
    size_is_valid = header[24:28] == header[92:96] and pages > 0  # SQLite's own rule for trusting the field
    if size_is_valid and os.path.getsize(path) < pages * page_size:
        raise RecordingError(f"{path} is truncated: {os.path.getsize(path)} bytes of {pages * page_size}")


class Recording:
    """Open with `Recording.open(path)`; use as a context manager or call `close()`."""

    def __init__(self, path: str, db: sqlite3.Connection, meta: dict[str, Any]):
        self.path = path
        self.db = db
        self.meta = meta
        self._link = _link_bits(meta)
        self.left_out: set[tuple[str, Any]] = set()  # (table, seq) of rows left out: a NULL, NaN or infinite number
        self.select = schema.select_for({table: {row[1] for row in db.execute(f"PRAGMA table_info({table})")}
                                         for table in schema.TABLES})
        self.tables = tuple(t for t in schema.TABLES if t not in schema.LATER_TABLES or _has_table(db, t))
        self.start, self.end = self._span()
        first, last = self._one(f"SELECT min(step), max(step) FROM steps WHERE {WHOLE_STEP}")
        self.first_step, self.last_step = (None, None) if first is None else (_int(first), _int(last))

    @classmethod
    def open(cls, path: str) -> "Recording":
        check_file(path)
        try:
            db = sqlite3.connect(Path(path).resolve().as_uri() + "?mode=ro", uri=True, check_same_thread=False)
        except sqlite3.Error as exc:
            raise RecordingError(f"cannot open {path}: {exc}") from None
        try:
            return cls(path, db, _read_meta(db, path))
        except RecordingError:
            db.close()
            raise
        except DAMAGE as exc:
            db.close()
            raise damaged(path, exc) from None

    def __enter__(self) -> "Recording":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self.db.close()

    # -- what the file says about the run -------------------------------------------------------------------
    @property
    def schema_version(self) -> int:
        return self.meta["schema_version"]

    @property
    def complete(self) -> bool:
        """The recorder closed the file after writing everything it got (False: the run or the recorder was
        killed, or a write failed; data up to then is there). Telemetry the front never got: info.gaps()."""
        return "closed" in self.meta and "recorder_error" not in self.meta

    @property
    def recorder_error(self) -> str | None:
        error = self.meta.get("recorder_error")
        return None if error is None else clean(error, 200)

    @property
    def config(self) -> dict[str, Any]:
        config = self.meta.get("config")
        return config if isinstance(config, dict) else {}

    @property
    def duration(self) -> float:
        return self.end - self.start

    @property
    def world_size(self) -> int:
        where = self.meta.get("rendezvous")
        size = where.get("world_size") if isinstance(where, dict) else None
        if isinstance(size, int) and size > 0:
            return size
        ranks = self._one("SELECT count(DISTINCT rank) FROM steps")[0]
        return max(1, ranks or 1)

    def segments(self) -> list[dict[str, Any]]:
        """[{index, step, t (s from the start), config, buckets}] from the switches the ranks reported."""
        try:
            return self._segments()
        except RecordingError:
            raise
        except DAMAGE as exc:
            raise damaged(self.path, exc) from None

    def _segments(self) -> list[dict[str, Any]]:
        buckets = self.meta.get("ddp_buckets") if isinstance(self.meta.get("ddp_buckets"), dict) else {}
        out = []
        for segment, step, at, config in self.query("SELECT segment, step, at, config FROM segments ORDER BY segment"):
            if not (_whole(step) and _whole(segment) and isinstance(at, (int, float)) and math.isfinite(at)):
                self.left_out.add(("segments", segment))  # a switch without a step or a time: left out, said
                continue
            config = json.loads(config) if isinstance(config, str) else None
            out.append({"index": _int(segment), "step": _int(step), "t": max(0.0, _num(at) - self.start),
                        "config": config if isinstance(config, dict) else {}, "buckets": buckets.get(str(segment))})
        if not out and self.first_step is not None:  # a file without switch events: one segment, the run's config
            sync = self.config.get("sync") if isinstance(self.config.get("sync"), dict) else {}
            out.append({"index": 0, "step": self.first_step, "t": 0.0, "config": sync, "buckets": buckets.get("0")})
        return out

    def segment_figures(self, warmup: int | None = None) -> list:
        """The per-segment table (ddptop.metrics) over every step in the file: what `info`, `report`,
        `export --csv` and a replayed screen show. `warmup`: the run's own (metrics.warmup_for) unless given."""
        table = self.segment_table(warmup)
        table.apply_all(self.step_events())
        return table.segments()

    def segment_table(self, warmup: int | None = None):
        """segment_figures' table holding the file's switches, before any step: fed the steps (its `passing`, as
        the report reads them), its segments() are segment_figures()."""
        from ddptop import metrics
        from ddptop.events import ConfigApplied

        table = metrics.SegmentTable(metrics.warmup_for(self.config) if warmup is None else warmup)
        switches = self.query("SELECT seq, at, data FROM events WHERE kind = 'config_applied' ORDER BY seq")
        table.apply_all(e for e in (self._decode("events", row) for row in switches) if isinstance(e, ConfigApplied))
        return table

    def count(self, table: str) -> int:
        return self._one(f"SELECT count(*) FROM {table}")[0] if table in self.tables or table not in schema.TABLES \
            else 0  # a table the file was written before

    def memory_events(self) -> Iterator[Event]:
        """Every MemorySample in recorded order (a file from before issue 43 holds none)."""
        sql = f"{self.select['memory']} ORDER BY seq"
        return _kept(self._decode(t, row) for _seq, t, row in self._stream("memory", sql))

    # -- queries --------------------------------------------------------------------------------------------
    def query(self, sql: str, args: tuple = ()) -> list[tuple]:
        try:
            return self.db.execute(sql, args).fetchall()
        except DAMAGE as exc:
            raise damaged(self.path, exc) from None

    def stream(self, sql: str, args: tuple = ()) -> Iterator[tuple]:
        """`query`'s rows a batch at a time: a million step rows are never held at once (the report's memory bound)."""
        try:
            cursor = self.db.execute(sql, args)
            while batch := cursor.fetchmany(4096):
                yield from batch
        except DAMAGE as exc:
            raise damaged(self.path, exc) from None

    def _one(self, sql: str, args: tuple = ()) -> tuple:
        rows = self.query(sql, args)
        return rows[0] if rows else (None,)

    def events(self, tables: tuple[str, ...] = schema.TABLES) -> Iterator[Event]:
        """Every event in the order it was recorded (of `tables` only: e.g. all but steps and spans, the bulk)."""
        streams = [self._stream(table, f"{self.select[table]} ORDER BY seq") for table in tables]
        for _seq, table, row in heapq.merge(*streams):
            event = self._decode(table, row)
            if event is not None:
                yield event

    def between(self, lo: float, hi: float) -> list[Event]:
        """Events with lo < at ≤ hi (playback clock), in recorded order."""
        return self._merged({table: (f"{self.select[table]} WHERE at > ? AND at <= ?", (lo, hi))
                             for table in schema.TABLES})

    def history(self, at: float, steps: int = 200, seconds: float = 30.0, spans_per_rank: int = 2) -> list[Event]:
        """What a screen needs to redraw at `at`: every rare event (joins, starts, switches, epochs, logs) up to
        there, the last `steps` steps of every rank, the last sampled spans of each rank, `seconds` of samples."""
        step = self.step_at_time(at)
        low = -1 if step is None else step - steps
        high = -1 if step is None else step + 1  # ranks may be one step apart
        return self._merged({
            "events": (f"{self.select['events']} WHERE at <= ?", (at,)),
            # `+at` keeps SQLite on the step index: the at-range would cover the whole file
            "steps": (f"{self.select['steps']} WHERE step > ? AND step <= ? AND +at <= ?", (low, high, at)),
            "spans": (f"{self.select['spans']} WHERE at <= ? ORDER BY at DESC LIMIT ?",
                      (at, spans_per_rank * self.world_size)),
            "system": (f"{self.select['system']} WHERE at > ? AND at <= ?", (at - seconds, at)),
            "memory": self._memory_history(at),
        })

    def _memory_history(self, at: float) -> tuple[str, tuple]:
        """Each rank's newest memory sample of the segment in force at `at` and its largest peak's (metrics.memory
        needs no other: the kinds are the newest's, the peak the largest), not every sample of a long segment."""
        sel = self.select["memory"]
        seg = f"(SELECT max(segment) FROM ({sel}) WHERE at <= ?)"
        # SQLite gives a bare column of a max() aggregate from the row holding that max
        sql = (f"{sel} WHERE seq IN (SELECT max(seq) FROM ({sel}) WHERE at <= ? AND segment = {seg} GROUP BY rank "
               f"UNION SELECT seq FROM (SELECT seq, max(peak_bytes) FROM ({sel}) WHERE at <= ? AND segment = {seg} "
               f"GROUP BY rank))")
        return sql, (at, at, at, at)

    def step_at_time(self, at: float) -> int | None:
        """The newest step any rank had finished by playback time `at`."""
        return self._one("SELECT step FROM steps WHERE at <= ? ORDER BY at DESC, seq DESC LIMIT 1", (at,))[0]

    def time_of_step(self, step: int) -> float | None:
        """Playback time at which every rank had finished `step`."""
        return self._one("SELECT max(at) FROM steps WHERE step = ?", (step,))[0]

    def step_events(self, first: int | None = None, stop: int | None = None, table: str = "steps") -> Iterator[Event]:
        """StepDone (or StepSpans with table="spans") of steps first ≤ step < stop, in recorded order."""
        lo, hi = -(1 << 62) if first is None else first, (1 << 62) if stop is None else stop
        sql = f"{self.select[table]} WHERE step >= ? AND step < ? ORDER BY seq"
        return _kept(self._decode(table, row) for _seq, table, row in self._stream(table, sql, (lo, hi)))

    def clock_syncs(self) -> list[ClockSync]:
        """Rank 0's clock ping-pongs (metrics.stragglers.clocks), in recorded order; older recordings hold none."""
        rows = self.query("SELECT data FROM events WHERE kind = 'clock_sync' ORDER BY seq")
        return [e for (blob,) in rows for e in [self._decode("events", (0, 0.0, blob))] if isinstance(e, ClockSync)]

    def step_losses(self) -> Iterator[tuple[int, int, float, float]]:
        """(step, segment, t, loss) of every StepDone, by step and then in recorded order, checked as whole rows
        are: a loss series read without decoding every row (the steps_step index keeps it in order, no sort)."""
        names = ("step", "segment", "t", "loss")
        for seq, _table, row in self._stream("steps", f"SELECT seq, {', '.join(names)} FROM steps ORDER BY step, seq"):
            try:
                yield tuple(schema.decode_step_columns(names, row[1:]))
            except schema.BadNumber:  # a NULL, NaN or infinite number: the row is left out (and said), as _decode does
                self.left_out.add(("steps", seq))
            except DAMAGE as exc:
                raise damaged(self.path, exc) from None

    def system_events(self, first: int | None = None, stop: int | None = None) -> Iterator[Event]:
        """System samples, all or those taken while steps first ≤ step < stop ran."""
        lo, hi = -math.inf, math.inf
        if first is not None or stop is not None:
            window = self._one("SELECT min(at - iter_s), max(at) FROM steps WHERE step >= ? AND step < ?",
                               (-(1 << 62) if first is None else first, (1 << 62) if stop is None else stop))
            lo, hi = (0.0, -1.0) if window[0] is None else window
        sql = f"{self.select['system']} WHERE at >= ? AND at <= ? ORDER BY seq"
        return _kept(self._decode(t, row) for _seq, t, row in self._stream("system", sql, (lo, hi)))

    def _merged(self, queries: dict[str, tuple[str, tuple]]) -> list[Event]:
        rows = [(row[0], table, row) for table, (sql, args) in queries.items() for row in self.query(sql, args)]
        rows.sort(key=lambda r: r[0])
        return list(_kept(self._decode(table, row) for _seq, table, row in rows))

    def _stream(self, table: str, sql: str, args: tuple = ()) -> Iterator[tuple]:
        try:
            for row in self.db.execute(sql, args):
                yield row[0], table, row
        except DAMAGE as exc:
            raise damaged(self.path, exc) from None

    def _decode(self, table: str, row: tuple) -> Event | None:
        """The row's event; None for a row left out (a NULL, NaN or infinite number: `left_out` counts it)."""
        try:
            _finite_at(row[1])  # the playback clock places the row: without it the row has no place
            event = schema.decode_row(table, row)
            return _with_link(event, self._link) if table == "system" and self._link else event
        except schema.BadNumber:
            self.left_out.add((table, row[0]))
            return None
        except DAMAGE as exc:
            raise damaged(self.path, exc) from None

    def left_out_line(self) -> str:
        """What the reader left out of this file, in words ('' when nothing)."""
        if not self.left_out:
            return ""
        tables = ", ".join(f"{t}: {n}" for t, n in Counter(table for table, _seq in self.left_out).items())
        return (f"left out {len(self.left_out)} row{'s' if len(self.left_out) != 1 else ''} holding a NULL, NaN or "
                f"infinite number where ddptop writes a finite one ({tables})")

    def _span(self) -> tuple[float, float]:
        lows, highs = [], []
        for table in self.tables:
            # rows with an infinite `at` are left out when read; NULLs are not counted by min/max
            lo, hi = self._one(f"SELECT min(at), max(at) FROM {table} WHERE abs(at) <= {FINITE_MAX}")
            if lo is not None:
                lows.append(_num(lo))
                highs.append(_num(hi))
        return (min(lows), max(highs)) if lows else (0.0, 0.0)


def damaged(path: str, exc: BaseException) -> RecordingError:
    detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if isinstance(exc, sqlite3.DatabaseError) and "not a database" in detail:
        return RecordingError(f"{path} is not a ddptop recording (not an SQLite database)")
    return RecordingError(f"{path} is damaged: {detail[:200]}")


def _read_meta(db: sqlite3.Connection, path: str) -> dict[str, Any]:
    try:
        rows = db.execute("SELECT key, value FROM meta").fetchall()
    except sqlite3.OperationalError as exc:
        if "no such table" in str(exc):
            raise RecordingError(f"{path} is not a ddptop recording (an SQLite database of another kind)") from None
        raise
    meta = {key: clean_value(json.loads(value)) for key, value in rows}  # shown by info: never raw
    if meta.get("format") != schema.FORMAT:
        raise RecordingError(f"{path} is not a ddptop recording (an SQLite database of another kind)")
    version = meta.get("schema_version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise RecordingError(f"{path} is damaged: bad schema version {version!r}")
    if version > schema.SCHEMA_VERSION:
        raise RecordingError(f"{path} was written by a newer ddptop (recording schema {version}; this ddptop reads "
                             f"up to {schema.SCHEMA_VERSION}): upgrade ddptop to open it")
    events = meta.get("event_schema", 1)
    if isinstance(events, int) and events > EVENT_SCHEMA:
        raise RecordingError(f"{path} was written by a newer ddptop (event schema {events}; this ddptop reads up "
                             f"to {EVENT_SCHEMA}): upgrade ddptop to open it")
    for table in schema.TABLES:  # a file with our meta but missing tables is damaged, not empty
        if table not in schema.LATER_TABLES:  # older files lack these (schema.LATER_TABLES)
            db.execute(f"SELECT seq, at FROM {table} LIMIT 0")
    return meta


def _has_table(db: sqlite3.Connection, table: str) -> bool:
    return bool(db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (table,)).fetchall())


WHOLE_STEP = "typeof(step) = 'integer' AND typeof(rank) = 'integer'"  # rows the reader keeps (NULL, inf: left out)
FINITE_MAX = 1.7976931348623157e308  # the largest finite double: SQL's abs(at) <= it keeps NULL and ±inf out


def _finite_at(value: Any) -> None:
    if not (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)):
        raise schema.BadNumber(f"a row's time is not a finite number ({value!r})")


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _kept(events) -> Iterator[Event]:
    return (e for e in events if e is not None)


def _num(value: Any) -> float:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    raise EventDecodeError(f"expected a finite number, found {value!r}")


def _int(value: Any) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    raise EventDecodeError(f"expected a whole number, found {value!r}")


def _link_bits(meta: Any) -> float | None:
    """meta.link's rate (a lab run's link, bits/s each way), or None where it is absent or not a positive number."""
    link = meta.get("link") if isinstance(meta, dict) else None
    bits = link.get("bits_per_s") if isinstance(link, dict) else None
    ok = type(bits) in (int, float) and math.isfinite(bits) and bits > 0
    return float(bits) if ok else None


def _with_link(sample: Event, bits: float) -> Event:
    """A lab recording from before NICs carried their speed: the job's interface gets meta.link's rate."""
    if not isinstance(sample, SystemSample):
        return sample
    nics = tuple(dataclasses.replace(n, speed_bits_per_s=bits, speed_by=LINK_BY)
                 if n.iface == sample.job_iface and n.speed_bits_per_s is None else n for n in sample.nics)
    return dataclasses.replace(sample, nics=nics)
