"""The recording's tables and the codec between events and rows (typed columns, JSON, never pickle).

Every row carries `seq`, the order the recorder received it in (one counter across tables), and `at`,
the playback clock (replay, seeking, durations): when the front received the event, as the recording's start
in wall time plus the front's monotonic time since, never a rank's clock (one rank an hour ahead would shift
every later row). Streams written at once (tests, rewritten recordings) and files before this use the running
maximum of event times instead; either never goes backwards, so replaying by `at` keeps the recorded order,
and a reader reads both alike. The ranks' own times stay in the `t`/`t0` columns and the events' data.
"""

from __future__ import annotations

import dataclasses
import json
import math
import operator
from typing import Any, Callable

from ddptop.events import (Event, EventDecodeError, GpuStat, MemorySample, NicStat, Span, StepDone, StepSpans,
                           SystemSample, event_from_dict)
from ddptop.safe import clean_value

FORMAT = "ddptop-recording"
SCHEMA_VERSION = 2  # of the file layout; events inside carry their own events.SCHEMA_VERSION
# schema 1 files lack the step columns added since (fwd_s, bwd_s, opt_s, own_s): they read back as 0

STEP_FIELDS = tuple(f.name for f in dataclasses.fields(StepDone))
SYSTEM_FIELDS = tuple(f.name for f in dataclasses.fields(SystemSample))
MEMORY_FIELDS = tuple(f.name for f in dataclasses.fields(MemorySample))
_SQL_TYPES = {"int": "INTEGER", "bool": "INTEGER", "float": "REAL", "str": "TEXT", "float | None": "REAL"}


def _columns(cls: type) -> str:
    return ", ".join(f"{f.name} {_SQL_TYPES.get(f.type, 'TEXT')}" for f in dataclasses.fields(cls))


DDL = f"""
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE segments (segment INTEGER PRIMARY KEY, step INTEGER, t REAL, at REAL, config TEXT);
CREATE TABLE steps (seq INTEGER PRIMARY KEY, at REAL, {_columns(StepDone)});
CREATE TABLE spans (seq INTEGER PRIMARY KEY, at REAL, rank INTEGER, step INTEGER, segment INTEGER, t0 REAL,
                    spans TEXT);
CREATE TABLE system (seq INTEGER PRIMARY KEY, at REAL, {_columns(SystemSample)});
CREATE TABLE events (seq INTEGER PRIMARY KEY, at REAL, kind TEXT, rank INTEGER, step INTEGER, t REAL, data TEXT);
CREATE TABLE memory (seq INTEGER PRIMARY KEY, at REAL, {_columns(MemorySample)});
CREATE INDEX steps_rank_step ON steps (rank, step);
CREATE INDEX steps_step ON steps (step);
CREATE INDEX steps_at ON steps (at);
CREATE INDEX spans_rank_step ON spans (rank, step);
CREATE INDEX spans_at ON spans (at);
CREATE INDEX system_at ON system (at);
CREATE INDEX events_at ON events (at);
CREATE INDEX memory_at ON memory (at);
"""

TABLES = ("steps", "spans", "system", "events", "memory")
# tables a file may lack: it was written before they were added (memory: issue 43), and reads as holding no rows
LATER_TABLES = ("memory",)
INSERT = {
    "steps": f"INSERT INTO steps VALUES (?, ?, {', '.join('?' * len(STEP_FIELDS))})",
    "spans": "INSERT INTO spans VALUES (?, ?, ?, ?, ?, ?, ?)",
    "system": f"INSERT INTO system VALUES (?, ?, {', '.join('?' * len(SYSTEM_FIELDS))})",
    "events": "INSERT INTO events VALUES (?, ?, ?, ?, ?, ?, ?)",
    "memory": f"INSERT INTO memory VALUES (?, ?, {', '.join('?' * len(MEMORY_FIELDS))})",
}


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


def event_time(event: Event) -> float | None:
    t = getattr(event, "t", getattr(event, "t0", None))
    return float(t) if isinstance(t, (int, float)) and not isinstance(t, bool) and math.isfinite(t) else None


def encode(event: Event, seq: int, at: float) -> tuple[str, tuple]:
    """(table, row) for one event."""
    if isinstance(event, StepDone):
        return "steps", (seq, at, *(getattr(event, name) for name in STEP_FIELDS))
    if isinstance(event, StepSpans):
        spans = [[s.kind, s.name, s.start_s, s.dur_s, s.nbytes, s.tx_bytes, s.rx_bytes] for s in event.spans]
        return "spans", (seq, at, event.rank, event.step, event.segment, event.t0, _dumps(spans))
    if isinstance(event, SystemSample):
        row = [getattr(event, name) for name in SYSTEM_FIELDS]
        row[SYSTEM_FIELDS.index("nics")] = _dumps([list(dataclasses.astuple(n)) for n in event.nics])
        row[SYSTEM_FIELDS.index("gpus")] = _dumps([list(dataclasses.astuple(g)) for g in event.gpus])
        return "system", (seq, at, *row)
    if isinstance(event, MemorySample):
        return "memory", (seq, at, *(getattr(event, name) for name in MEMORY_FIELDS))
    step = getattr(event, "step", None)
    return "events", (seq, at, event.kind, getattr(event, "rank", None), step if isinstance(step, int) else None,
                      event_time(event), _dumps(event.to_dict()))


# -- decoding: every value is checked, since a file can come from anyone and may be damaged --------------

def _float(v: Any) -> float:
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return float(v) if isinstance(v, int) else v
    raise EventDecodeError(f"expected a number, found {type(v).__name__}")


def _int(v: Any) -> int:
    if isinstance(v, int) and not isinstance(v, bool):
        return v
    raise EventDecodeError(f"expected a whole number, found {type(v).__name__}")


def _bool(v: Any) -> bool:
    if v in (0, 1) and not isinstance(v, float):
        return bool(v)
    raise EventDecodeError(f"expected 0 or 1, found {v!r}")


def _str(v: Any) -> str:
    if isinstance(v, str):
        return clean_value(v)  # layer names, hosts, interfaces: never raw to a terminal
    raise EventDecodeError(f"expected text, found {type(v).__name__}")


def _opt(check: Callable) -> Callable:
    return lambda v: None if v is None else check(v)


_CHECKS = {"int": _int, "float": _float, "bool": _bool, "str": _str, "float | None": _opt(_float),
           "int | None": _opt(_int), "str | None": _opt(_str)}


class BadNumber(EventDecodeError):
    """A NULL, NaN or infinite value in a column where ddptop writes only finite numbers: the reader leaves that
    one row out (and says so) instead of refusing the whole file."""


def _finite(check: Callable, optional: bool = False) -> Callable:
    def checked(v: Any) -> Any:
        if v is None:
            if optional:
                return None
            raise BadNumber("a number is missing (NULL or NaN)")
        if isinstance(v, float) and not math.isfinite(v):
            raise BadNumber(f"a number is not finite ({v})")
        return check(v)
    return checked


def _plain(kind: type, check: Callable) -> Callable:
    """`check`, with the common value first: a finite value of exactly `kind` is itself (v − v is 0.0 only when v
    is finite). The value-by-value check of a row that decode_step's whole-row test sends here."""
    def checked(v: Any) -> Any:
        if type(v) is kind and v - v == 0:
            return v
        return check(v)
    return checked


# a typed column of steps, spans or system: NULL (SQLite stores NaN as NULL), NaN and ±inf are BadNumber, except
# where the field may be empty (`… | None`) and in LOSS_FIELDS
_COLUMN = {**_CHECKS, "int": _plain(int, _finite(_int)), "float": _plain(float, _finite(_float)),
           "bool": _finite(_bool),
           "float | None": _finite(_float, optional=True), "int | None": _finite(_int, optional=True)}
LOSS_FIELDS = {"loss"}  # a diverged loss is NaN (stored as NULL) or infinite: a value worth showing, not damage
_STEP_CHECKS = [(lambda v: math.nan if v is None else _float(v)) if f.name in LOSS_FIELDS else _COLUMN[f.type]
                for f in dataclasses.fields(StepDone)]

_NIC_CHECKS = [_CHECKS[f.type] for f in dataclasses.fields(NicStat)]
_NIC_REQUIRED = sum(f.default is dataclasses.MISSING for f in dataclasses.fields(NicStat))
_GPU_CHECKS = [_CHECKS[f.type] for f in dataclasses.fields(GpuStat)]
_GPU_REQUIRED = sum(f.default is dataclasses.MISSING for f in dataclasses.fields(GpuStat))


def _typed(checks: list[Callable], values: Any) -> list:
    if not isinstance(values, (list, tuple)) or len(values) != len(checks):
        raise EventDecodeError("a row has the wrong number of values")
    return [check(v) for check, v in zip(checks, values)]


def _nic(values: Any) -> NicStat:
    """A NIC as a JSON list; lists from before the speed fields stop early and read speed unknown."""
    if isinstance(values, list) and len(values) == _NIC_REQUIRED:
        return NicStat(*_typed(_NIC_CHECKS[:_NIC_REQUIRED], values))
    return NicStat(*_typed(_NIC_CHECKS, values))


def _gpu(values: Any) -> GpuStat:
    """A GPU as a JSON list; lists from before later fields were added stop early and take their defaults."""
    if isinstance(values, list) and _GPU_REQUIRED <= len(values) < len(_GPU_CHECKS):
        return GpuStat(*_typed(_GPU_CHECKS[:len(values)], values))
    return GpuStat(*_typed(_GPU_CHECKS, values))


def _json(text: Any) -> Any:
    if not isinstance(text, str):
        raise EventDecodeError(f"expected JSON text, found {type(text).__name__}")
    return json.loads(text)


# a step row as ddptop writes it: every value of exactly its column's type, every float finite (their sum is: a NaN
# or ±inf in any makes it NaN or infinite; a sum too large for a float only sends the row to the checks), `sampled`
# 0 or 1. Such a row needs no value-by-value check: the report's CPU on 10^6 rows went from 46 to 42 s with it.
_STEP_TYPES = tuple(int if f.type in ("int", "bool") else float for f in dataclasses.fields(StepDone))
_STEP_FLOATS = operator.itemgetter(*(i for i, kind in enumerate(_STEP_TYPES) if kind is float))
_SAMPLED = [f.name for f in dataclasses.fields(StepDone)].index("sampled")


def decode_step(row: tuple) -> StepDone:
    if (isinstance(row, tuple) and tuple(map(type, row)) == _STEP_TYPES and math.isfinite(sum(_STEP_FLOATS(row)))
            and row[_SAMPLED] in (0, 1)):
        return StepDone(*row[:_SAMPLED], bool(row[_SAMPLED]), *row[_SAMPLED + 1:])
    return StepDone(*_typed(_STEP_CHECKS, row))


_STEP_COLUMNS = dict(zip(STEP_FIELDS, _STEP_CHECKS))


def decode_step_columns(names: tuple[str, ...], row: tuple) -> list:
    """Some columns of a step row (`names`, in that order), each checked as decode_step checks it."""
    return [_STEP_COLUMNS[name](value) for name, value in zip(names, row)]


def decode_spans(row: tuple) -> StepSpans:
    rank, step, segment, t0, blob = row
    items = _json(blob)
    if not isinstance(items, list):
        raise EventDecodeError("spans are not a list")
    spans = tuple(_span(s) for s in items)
    whole = _COLUMN["int"]
    return StepSpans(whole(rank), whole(step), whole(segment), _COLUMN["float"](t0), spans)


_NUMBER = (int, float)


def _span(s: Any) -> Span:
    """One span, checked inline: a sampled VGG step has ~100 and `ddptop info` reads every one of them."""
    if type(s) is not list or len(s) != 7:
        raise EventDecodeError("a span has the wrong number of values")
    kind, name, start, dur, nbytes, tx, rx = s
    if (type(kind) is not str or type(name) is not str or type(start) not in _NUMBER or type(dur) not in _NUMBER
            or type(nbytes) is not int or type(tx) is not int or type(rx) is not int):
        raise EventDecodeError("a span holds a value of the wrong type")
    return Span(clean_value(kind), clean_value(name), start, dur, nbytes, tx, rx)


def decode_system(row: tuple) -> SystemSample:
    values = dict(zip(SYSTEM_FIELDS, row))
    nics, gpus = _json(values.pop("nics")), _json(values.pop("gpus"))
    if not isinstance(nics, list) or not isinstance(gpus, list):
        raise EventDecodeError("nics or gpus are not a list")
    checks = {f.name: _COLUMN[f.type] for f in dataclasses.fields(SystemSample) if f.type in _COLUMN}
    if len(values) != len(checks):
        raise EventDecodeError("a system row has the wrong number of values")
    typed = {name: checks[name](v) for name, v in values.items()}
    return SystemSample(**typed, nics=tuple(_nic(n) for n in nics),
                        gpus=tuple(_gpu(g) for g in gpus))


_MEMORY_CHECKS = [_COLUMN[f.type] for f in dataclasses.fields(MemorySample)]


def decode_memory(row: tuple) -> MemorySample:
    return MemorySample(*_typed(_MEMORY_CHECKS, row))


def decode_event(blob: Any) -> Event:
    return event_from_dict(_json(blob))  # every field typed and ranged there, as for the store's events


DECODE = {"steps": decode_step, "spans": decode_spans, "system": decode_system, "memory": decode_memory}
SELECT = {
    "steps": f"SELECT seq, at, {', '.join(STEP_FIELDS)} FROM steps",
    "spans": "SELECT seq, at, rank, step, segment, t0, spans FROM spans",
    "system": f"SELECT seq, at, {', '.join(SYSTEM_FIELDS)} FROM system",
    "events": "SELECT seq, at, data FROM events",
    "memory": f"SELECT seq, at, {', '.join(MEMORY_FIELDS)} FROM memory",
}


NO_ROWS = {"memory": ("seq", "at", *MEMORY_FIELDS)}  # a later table's columns, for a file without it


def select_for(columns: dict[str, set[str]]) -> dict[str, str]:
    """SELECT statements for a file whose tables have `columns` (older files lack newer step columns)."""
    out = dict(SELECT)
    for table in LATER_TABLES:
        if not columns.get(table, True):  # a file from before the table: no rows, from a subquery that names none
            nulls = ", ".join(f"NULL AS {name}" for name in NO_ROWS[table])
            out[table] = f"SELECT * FROM (SELECT {nulls} WHERE 0) AS {table}"
    for table, cls, fields in (("steps", StepDone, STEP_FIELDS), ("system", SystemSample, SYSTEM_FIELDS)):
        have = columns.get(table, set(fields))
        if not set(fields) <= have:
            defaults = {f.name: f.default for f in dataclasses.fields(cls)}
            picked = [name if name in have else f"{_literal(defaults.get(name))} AS {name}" for name in fields]
            out[table] = f"SELECT seq, at, {', '.join(picked)} FROM {table}"
    return out


def _literal(value: Any) -> str:
    if value is None:  # an optional column: NULL reads as None
        return "NULL"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise EventDecodeError("a recording lacks a column that has no default")
    return repr(value)


def decode_row(table: str, row: tuple) -> Event:
    """A row as SELECT[table] returns it, without seq and at."""
    if table == "events":
        return decode_event(row[2])
    return DECODE[table](row[2:])
