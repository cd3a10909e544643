"""Typed decoding at the door: every field of every event kind, given a value of the wrong type or range, is refused
as an EventDecodeError; a batch keeps its good events and counts its bad ones, and a rank's batch speaks only for it."""

from __future__ import annotations

import dataclasses
import json
import math
import typing

import pytest

from ddptop.events import (EVENT_TYPES, FRONT, MAX_TEXT, MEMORY_BY, SIGNED, TUNABLE, ConfigApplied, EventDecodeError,
                           LogLine, NicStat, Span, StepDone, StepSpans, decode_batch, event_from_dict)

T0 = 1.7e9
TEXT_TOO_LONG = "x" * (MAX_TEXT + 1)


def good(tp, name: str):
    """A valid JSON value for annotation `tp` (field `name`), the way to_dict writes it."""
    if tp is bool:
        return True
    if tp is int:
        return 3
    if tp is float:
        return T0 if name in ("t", "t0") else 0.25
    if tp is str:
        if name == "what":
            return TUNABLE[1]  # a tune says which of its kinds it is
        return MEMORY_BY[1] if name == "by" else "ok"  # a memory sample says which of its measures it took
    if dataclasses.is_dataclass(tp):
        record = {f.name: good(typing.get_type_hints(tp)[f.name], f.name) for f in dataclasses.fields(tp)}
        return list(record.values()) if tp is Span else record  # a span travels as a list (StepSpans.to_dict)
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is tuple:
        return [good(args[0], name)] if args[-1] is Ellipsis else [good(a, name) for a in args]
    if origin is dict:
        return {"strategy": "ddp", "bucket_mb": 25.0, "async_op": False, "batch_size": 16, "lr": 0.1} \
            if name == "config" else {"0": "ab"}
    return good(next(a for a in args if a is not type(None)), name)  # X | None


def hostile(tp, name: str) -> list:
    """Values of the wrong type or range for annotation `tp` (None is fine where the annotation allows it)."""
    optional = type(None) in typing.get_args(tp)
    if optional:
        tp = next(a for a in typing.get_args(tp) if a is not type(None))
    wrong = [{"a": 1}, [1]] + ([] if optional else [None])
    if tp is bool:
        return wrong + [1, 0, "true", 1.0]
    if tp is int:
        return wrong + ["3", 1.5, True, 1 << 63, -(1 << 63) - 1] + ([] if name in SIGNED else [-2 if name == "rank" else -1])  # rank -1: the front's own line
    if tp is float:
        bad = wrong + ["0.25", True, 10 ** 400]
        return bad if name in ("loss", "test_loss") else bad + [math.nan, math.inf, -math.inf]
    if tp is str:
        return wrong + [5, 2.5, False, TEXT_TOO_LONG]
    return [[1] if typing.get_origin(tp) is dict else {"a": 1}, 5, "text"]  # a container or a nested record


def valid(cls) -> dict:
    hints = typing.get_type_hints(cls)
    return {"kind": cls.kind, "v": 1, **{f.name: good(hints[f.name], f.name) for f in dataclasses.fields(cls)}}


def wire(cls, data: dict) -> list:
    return [data["kind"], data["v"], *(data[f.name] for f in dataclasses.fields(cls))]


CASES = [(cls, f.name, value) for cls in EVENT_TYPES.values() for f in dataclasses.fields(cls)
         for value in hostile(typing.get_type_hints(cls)[f.name], f.name)]


def test_every_kind_decodes_from_valid_values():
    for cls in EVENT_TYPES.values():
        event = event_from_dict(json.loads(json.dumps(valid(cls))))
        assert type(event) is cls
        assert json.loads(json.dumps(event.to_dict())) == valid(cls)  # nothing lost or retyped on the way


@pytest.mark.parametrize("form", ["object", "wire"])  # wire: Event.to_wire's list, what a rank's Publisher sends
@pytest.mark.parametrize("cls, name, value", CASES,
                         ids=[f"{c.kind}.{n}={type(v).__name__}:{str(v)[:12]}" for c, n, v in CASES])
def test_each_field_refuses_a_value_of_the_wrong_type_or_range(cls, name, value, form):
    data = valid(cls)
    data[name] = value
    sent = data if form == "object" else wire(cls, data)
    with pytest.raises(EventDecodeError, match=name):
        event_from_dict(json.loads(json.dumps(sent)))  # as it arrives: json reads NaN, Infinity and long numbers


NESTED = [
    ("step_spans", "spans", [["fwd", "a", "0.1", 0.1, 0, 0, 0]], r"spans\[0\].start_s"),
    ("step_spans", "spans", [["fwd", "a", 0.1, 0.1, -5, 0, 0]], r"spans\[0\].nbytes"),
    ("step_spans", "spans", [["fwd", 7, 0.1, 0.1, 0, 0, 0]], r"spans\[0\].name"),
    ("step_spans", "spans", [["fwd", "a", 0.1, math.nan, 0, 0, 0]], r"spans\[0\].dur_s"),
    ("system_sample", "nics", [{**good(NicStat, ""), "rx_bytes": {"x": 1}}], r"nics\[0\].rx_bytes"),
    ("system_sample", "gpus", [{"index": 0, "name": "g", "util_percent": True, "mem_used_bytes": None,
                                "mem_total_bytes": None, "power_w": None, "temp_c": None}], r"gpus\[0\].util_percent"),
    ("run_started", "layers", [["features.0", "1792"]], r"layers\[0\]\[1\]"),
    ("run_started", "layers", [["features.0"]], r"layers\[0\]"),
    ("out_of_memory", "ranks", [1, True], r"ranks\[1\]"),
    ("models_diverged", "fingerprints", {"0": 12}, r"fingerprints\['0'\]"),
    ("config_applied", "config", {"strategy": "ddp", "bucket_mb": "25"}, "config.bucket_mb"),
    ("config_applied", "config", {"strategy": "ddp", "batch_size": 16.5}, "config.batch_size"),
    ("config_applied", "config", {"strategy": "ddp", "async_op": 0}, "config.async_op"),
    ("config_applied", "config", {"strategy": "ddp", "extra": {"deep": [1]}}, r"config\['extra'\]"),
]


@pytest.mark.parametrize("kind, name, value, where", NESTED, ids=[w for *_, w in NESTED])
def test_nested_containers_are_checked_item_by_item(kind, name, value, where):
    data = {**valid(EVENT_TYPES[kind]), name: value}
    with pytest.raises(EventDecodeError, match=where):
        event_from_dict(data)


def test_a_loss_may_be_nan_and_floats_take_whole_numbers():
    data = {**valid(StepDone), "loss": math.nan, "iter_s": 1}
    event = event_from_dict(json.loads(json.dumps(data)))  # json writes NaN for a diverged loss
    assert math.isnan(event.loss) and event.iter_s == 1.0 and type(event.iter_s) is float
    assert event_from_dict({**valid(ConfigApplied), "request_id": -1}).request_id == -1  # a broken counter, said


def test_only_a_log_line_may_come_from_the_front():
    """Rank -1 (events.FRONT) is the front's own line, recorded as such; no other event has it."""
    assert event_from_dict({**valid(LogLine), "rank": FRONT}).who == "ddptop"
    with pytest.raises(EventDecodeError, match="rank"):
        event_from_dict({**valid(StepDone), "rank": FRONT})


def test_text_is_cleaned_not_refused():
    event = event_from_dict({**valid(StepSpans), "spans": [["fwd", "a\x1b[2J", 0.0, 0.1, 0, 0, 0]]})
    assert event.spans[0].name == "a\\x1b[2J"


def test_a_batch_keeps_its_good_events_and_says_why_each_bad_one_was_refused():
    step = valid(StepDone)
    items = [{**step, "rank": 1, "step": 0}, {**step, "rank": 1, "iter_s": "x"}, {**step, "rank": 1, "step": 2},
             {**step, "rank": 0, "step": 3}, {"kind": "nope", "v": 1}, {**step, "rank": 1, "step": 4}]
    events, refused = decode_batch(json.dumps(items).encode(), 1)
    assert [e.step for e in events] == [0, 2, 4]
    assert len(refused) == 3 and "iter_s" in refused[0] and "claims rank 0" in refused[1]
    assert "unknown event kind" in refused[2]
    with pytest.raises(EventDecodeError):
        decode_batch(b'{"not": "a list"}', 1)


def test_the_standard_error_of_a_step_time_has_one_name():
    """`step_se_s` (metrics.Figures.step_se_s) in events, advise's rows and the tuner; a tune note recorded before
    the rename (its trials' `spread_s`) still decodes, into `step_se_s`."""
    import pathlib

    from ddptop.events import TuneNote, TuneTrial

    assert "step_se_s" in {f.name for f in dataclasses.fields(TuneTrial)}
    trial = {"segment": 1, "bucket_mb": 5.0, "first_step": 22, "last_step": 41, "step_s": 0.475}
    old = {"kind": "tune_note", "v": 1, "request_id": 0, "start": {**trial, "segment": 0, "spread_s": 0.004},
           "trials": [{**trial, "spread_s": 0.006}], "kept_mb": 5.0, "gain_s": 0.025, "reason": "", "t": T0}
    note = event_from_dict(old)
    assert (note.start.step_se_s, note.trials[0].step_se_s) == (0.004, 0.006)
    assert event_from_dict(json.loads(json.dumps(note.to_dict()))) == note
    assert "spread_s" not in json.dumps(note.to_dict())
    both = {**old, "trials": [{**trial, "spread_s": 0.006, "step_se_s": 0.007}]}  # the new name wins
    assert event_from_dict(both).trials[0].step_se_s == 0.007
    assert event_from_dict({**old, "trials": [trial]}).trials[0].step_se_s == 0.0  # older still: no error at all
    assert isinstance(note, TuneNote)
    root = pathlib.Path(__file__).resolve().parents[2]
    named = [f"{p.relative_to(root)}:{n}" for where in ("ddptop", "benchmarks") for p in (root / where).rglob("*.py")
             for n, line in enumerate(p.read_text().split("\n"), 1)
             if ("spread_s" in line or "step_s_se" in line) and "OLD_NAMES" not in line]
    assert named == [], "the standard error is step_se_s: " + ", ".join(named)


def test_spans_decode_to_the_spans_that_were_sent_in_every_compact_form():
    """The front builds a sampled step's spans without Span's __init__ (events._plain_span: issue 41's 1,024 ranks):
    each must be the Span a constructor makes (equal, same hash and repr, end_s), the defaults filled for the shorter
    forms, and a span that does not check out still refused by name."""
    sent = (Span("comm", "bucket 3", 0.5, 0.25, 1 << 20, 3, 4), Span("fwd", "features.0", 0.0, 0.125))
    event = StepSpans(1, 7, 0, T0, sent)
    got = event_from_dict(json.loads(json.dumps(event.to_dict())))
    assert got == event and got.spans == sent and hash(got.spans) == hash(sent) and repr(got) == repr(event)
    assert [s.end_s for s in got.spans] == [0.75, 0.125]
    for form in (["bwd", "x", 1.0, 0.5], ["bwd", "x", 1.0, 0.5, 9], ["bwd", "x", 1.0, 0.5, 9, 8]):
        span = event_from_dict({**valid(StepSpans), "spans": [form]}).spans[0]
        assert span == Span(*form) and dataclasses.asdict(span) == dataclasses.asdict(Span(*form))
    for bad, where in ((["bwd", "x", 1.0, math.inf, 0, 0, 0], r"spans\[1\].dur_s"),
                       (["bwd", "x", 1.0, 0.5, 0, -1, 0], r"spans\[1\].tx_bytes"),
                       (["bwd", 5, 1.0, 0.5, 0, 0, 0], r"spans\[1\].name"),
                       (["bwd", "x", 1.0, 0.5, 0, 0, True], r"spans\[1\].rx_bytes")):
        with pytest.raises(EventDecodeError, match=where):
            event_from_dict({**valid(StepSpans), "spans": [list(sent[0].__dict__.values()), bad]})


# -- the wire form (Event.to_wire: [kind, schema, values in field order]), what a rank's Publisher sends ----------

def test_every_kind_travels_in_the_wire_form_unchanged():
    for cls in EVENT_TYPES.values():
        event = event_from_dict(json.loads(json.dumps(valid(cls))))
        sent = json.loads(json.dumps(event.to_wire()))
        assert sent == wire(cls, valid(cls))  # no key names: the fields' values, in order
        assert event_from_dict(sent) == event
        newer = event_from_dict(sent + [7, "a field a newer rank added"])  # appended fields: ignored
        assert newer == event


@pytest.mark.parametrize("items, why", [
    ([], "unknown event kind None"), (["step_done"], "unknown event kind None"),
    (["no_such_kind", 1], "unknown event kind 'no_such_kind'"), ([5, 1], "unknown event kind 5"),
    (["step_done", 99], "schema 99 is newer"), (["step_done", "1"], "schema '1' is newer"),
    (["step_done", 1, 0, 1], "missing"),  # fields left out are required ones: refused, never defaulted
])
def test_a_wire_list_that_is_no_event_is_refused_in_one_line(items, why):
    with pytest.raises(EventDecodeError, match=why):
        event_from_dict(items)


def test_a_ranks_wire_line_cannot_speak_for_the_front():
    line = LogLine(FRONT, "error", "the collector failed", T0)
    good_, bad = decode_batch(json.dumps([line.to_wire()]).encode(), 0)
    assert good_ == [] and bad == ["a log event in rank 0's batch claims rank -1"]
