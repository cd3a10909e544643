"""A rank's steps on the wire (issue 42): the Publisher sends a batch as a JSON list and one binary step block whose
records take the places whole numbers hold in the list, over real ZeroMQ sockets, in order and each once; the
Collector checks every record's fields as typed decoding checks JSON, and refuses a block that is no block or places
that do not add up."""

from __future__ import annotations

import dataclasses
import json
import math
import struct

import pytest
import zmq

from ddptop.control import keys
from ddptop.control.bus import MAX_BATCH_EVENTS, TEL, Collector, Publisher, receive
from ddptop.events import EventsRefused, LogLine, Span, StepDone, StepSpans, TelemetryGap

T0 = 1.7e9
MAGIC = b"\xffS"  # written out here, not imported: the test states the format the front reads


def done(rank: int, n: int, **changes) -> StepDone:
    return dataclasses.replace(StepDone(rank, n, 1, 2, T0 + n, 0.004, 0.001, 0.002, 0.0005, 0.0001, 0.25, 2, 2.3,
                                        10, 20, 30, n % 2 == 1, fwd_s=0.001, bwd_s=0.0005, opt_s=0.0005,
                                        own_s=1e-5, aside_s=0.5, micro_s=0.0, tokens=7, threads_s=2e-4), **changes)


def pack(event: StepDone, **raw) -> bytes:
    """A record as a rank's bytes would hold it, with `raw` values no honest rank packs (the format written out:
    u64 for int, f64 for float, u8 for bool, little-endian, fields in order)."""
    codes = {int: "Q", float: "d", bool: "B"}
    fields = dataclasses.fields(StepDone)
    fmt = "<" + "".join(codes[type(getattr(event, f.name))] for f in fields)
    return struct.pack(fmt, *(raw.get(f.name, getattr(event, f.name)) for f in fields))


def block(records: list[bytes], size: int | None = None) -> bytes:
    size = len(records[0]) if size is None else size
    return MAGIC + struct.pack("<H", size) + b"".join(records)


def take(rank: int, blob: bytes, steps: bytes | None = None) -> list:
    return Collector(4).take(rank, 1, blob, steps)


@pytest.fixture()
def link():
    """A real PUSH → PULL pair (inproc: the CURVE sockets of a job carry the same frames)."""
    ctx = zmq.Context()
    pull, push = ctx.socket(zmq.PULL), ctx.socket(zmq.PUSH)
    pull.bind("inproc://steps")
    push.connect("inproc://steps")
    yield push, pull
    push.close(linger=0)  # Publisher.close closed it already where a test closed its publisher
    pull.close(linger=0)
    ctx.term()


def received(pull) -> list[list[bytes]]:
    out = []
    while pull.poll(200):
        out.append(pull.recv_multipart())
    return out


def test_the_publisher_sends_runs_of_steps_as_binary_blocks_in_order_and_the_front_reads_them_all(link):
    push, pull = link
    publisher = Publisher(push, 1, interval_s=3600)  # flushed by hand
    sent = [done(1, 0), done(1, 1, loss=math.nan), LogLine(1, "info", "hello", T0),
            StepSpans(1, 2, 2, T0, (Span("fwd", "forward", 0.0, 0.001),)), done(1, 2), done(1, 3, loss=math.inf),
            done(1, 4)]
    for event in sent:
        publisher.emit(event)
    publisher.flush()
    messages = received(pull)
    publisher.close()
    assert len(messages) == 1
    parts = messages[0]
    assert parts[:3] == [TEL, b"1", b"1"] and len(parts) == 5
    assert parts[3].startswith(b'[2,["log",') and parts[3].endswith(b"]]],3]")  # two steps, line, spans, three steps
    assert parts[4][:2] == MAGIC and len(parts[4]) == 4 + 5 * 193  # header, 193 bytes a step (JSON: ~250)
    got = receive(parts, Collector(4), None)
    assert [e.kind for e in got] == [e.kind for e in sent]
    steps = [e for e in got if isinstance(e, StepDone)]
    assert [s.step for s in steps] == [0, 1, 2, 3, 4]
    assert math.isnan(steps[1].loss) and steps[3].loss == math.inf  # a diverged loss travels as such
    for a, b in zip(steps, [e for e in sent if isinstance(e, StepDone)]):
        if not math.isnan(a.loss):
            assert a == b and hash(a) == hash(b) and repr(a) == repr(b)
    assert got[2] == sent[2] and got[3] == sent[3]


def test_a_step_whose_fields_do_not_fit_the_record_goes_as_json_and_is_judged_there(link):
    push, pull = link
    publisher = Publisher(push, 1, interval_s=3600)
    publisher.emit(done(1, 0))
    publisher.emit(done(1, 1, comm_bytes=-5))  # a bug's negative count: no u64 holds it
    publisher.emit(done(1, 2))
    publisher.flush()
    parts = received(pull)[0]
    publisher.close()
    assert parts[3].startswith(b'[1,["step_done",') and parts[3].endswith(b"],1]") and len(parts[4]) == 4 + 2 * 193
    got = receive(parts, Collector(4), None)
    assert [e.step for e in got if isinstance(e, StepDone)] == [0, 2]
    refused = [e for e in got if isinstance(e, EventsRefused)]
    assert len(refused) == 1 and refused[0].count == 1 and "comm_bytes" in refused[0].reason


def test_many_steps_make_batches_within_the_caps_and_none_is_lost(link):
    push, pull = link
    n = 2 * MAX_BATCH_EVENTS + 300
    publisher = Publisher(push, 0, interval_s=3600, max_queue=2 * n)  # a queue that holds them all: none dropped
    for i in range(n):
        publisher.emit(done(0, i))
        if i % 700 == 0:
            publisher.emit(LogLine(0, "info", f"line {i}", T0))
    publisher.flush()
    messages = received(pull)
    publisher.close()
    collector = Collector(1)
    got = []
    for parts in messages:
        assert sum(map(len, parts[3:])) <= keys.MAX_BATCH_BYTES and len(parts) == 5
        got += receive(parts, collector, None)
    assert [int(m[2]) for m in messages] == list(range(1, len(messages) + 1)) and len(messages) == 3
    assert [len(receive(m, Collector(1, from_start=False), None)) for m in messages] == [MAX_BATCH_EVENTS] * 2 + [
        n + len(range(0, n, 700)) - 2 * MAX_BATCH_EVENTS]  # full batches hold the cap's count of events, not one less
    assert [e.step for e in got if isinstance(e, StepDone)] == list(range(n))
    assert [e.message for e in got if isinstance(e, LogLine)] == [f"line {i}" for i in range(0, n, 700)]
    assert not any(isinstance(e, (TelemetryGap, EventsRefused)) for e in got)


FIELDS = [f.name for f in dataclasses.fields(StepDone)]
WRONG = ([(name, 1 << 63) for name in FIELDS if isinstance(getattr(done(0, 0), name), int)
          and not isinstance(getattr(done(0, 0), name), bool) and name != "rank"]
         + [(name, value) for name in FIELDS if type(getattr(done(0, 0), name)) is float and name != "loss"
            for value in (math.inf, -math.inf, math.nan)]
         + [("sampled", 2), ("sampled", 255)])


@pytest.mark.parametrize("name, value", WRONG)
def test_each_field_of_a_record_refuses_a_value_out_of_its_range_alone(name, value):
    records = [pack(done(2, 0)), pack(done(2, 1), **{name: value}), pack(done(2, 2))]
    got = take(2, b"[3]", block(records))
    assert [e.step for e in got if isinstance(e, StepDone)] == [0, 2]
    refused = [e for e in got if isinstance(e, EventsRefused)]
    assert len(refused) == 1 and refused[0].count == 1 and f"step_done event: {name}:" in refused[0].reason


def test_a_record_in_another_ranks_name_is_refused():
    got = take(2, b"[1,2]", block([pack(done(2, 0)), pack(done(0, 1)), pack(done(3, 2))]))
    assert [e.step for e in got if isinstance(e, StepDone)] == [0]
    refused = [e for e in got if isinstance(e, EventsRefused)]
    assert refused[0].count == 2 and "claims rank 0" in refused[0].reason


ONE = block([pack(done(1, 0))])
TWO = block([pack(done(1, 0)), pack(done(1, 1))])


@pytest.mark.parametrize("blob, steps, why", [
    (b"[1]", ONE[:-1], "not a whole number of 193-byte records"),  # truncated
    (b"[2]", TWO[:-100], "not a whole number"),
    (b"[1]", MAGIC + b"\x01", "without its header"),
    (b"[1]", MAGIC, "without its header"),
    (b"[1]", block([pack(done(1, 0))[:7]], size=7), "7 bytes: not a size"),  # no field boundary of a StepDone
    (b"[1]", block([pack(done(1, 0))[:40]], size=40), "40 bytes: not a size"),  # before the required fields end
    (b"[0]", block([b""], size=0), "0 bytes: not a size"),
    (b"[1]", b"\xff\xff" + ONE[2:], "without its header"),  # another magic
    (b"[2]", ONE, "a run of 2 step records where the block holds 1 more"),
    (b"[1,1]", ONE, "a run of 1 step records where the block holds 0 more"),
    (b"[1]", None, "where the block holds 0 more"),  # a run without a block
    (b"[0]", ONE, "a run of 0"),
    (b"[-1]", ONE, "a run of -1"),
    (b"[1]", TWO, "holds 2 records, the batch places 1"),
    (b"[]", ONE, "holds 1 records, the batch places 0"),
    (b"[true]", ONE, "places 0"),  # not a whole number: an event that is none, and the record placed nowhere
    (b"[1.0]", ONE, "places 0"),
    (ONE, ONE, "not JSON"),
], ids=["truncated", "cut-short", "short-header", "magic-only", "size-7", "size-40", "size-0", "other-magic",
        "run-past-end", "runs-past-end", "run-no-block", "run-0", "run-negative", "record-unplaced", "no-runs",
        "run-true", "run-float", "block-as-list"])
def test_a_block_that_is_no_block_or_places_that_do_not_add_up_cost_the_batch_as_one_gap(blob, steps, why):
    got = take(1, blob, steps)
    assert len(got) == 1 and isinstance(got[0], TelemetryGap) and why in got[0].reason, got
    assert not any(isinstance(e, StepDone) for e in got)


def test_an_oversized_batch_of_a_list_and_a_block_each_under_the_cap_is_refused_whole():
    n = keys.MAX_BATCH_BYTES // 193 // 2 + 1
    steps = block([pack(done(1, i)) for i in range(n)])
    listed = json.dumps([n] + [LogLine(1, "info", "x" * 1000, T0).to_wire()] * (len(steps) // 1000)).encode()
    assert len(steps) < keys.MAX_BATCH_BYTES and len(listed) < keys.MAX_BATCH_BYTES < len(steps) + len(listed)
    got = take(1, listed, steps)
    assert len(got) == 1 and isinstance(got[0], TelemetryGap) and "over the" in got[0].reason


def test_a_message_of_more_parts_than_a_list_and_a_block_is_no_rank_message():
    assert receive([TEL, b"1", b"1", b"[1]", ONE, b"[]"], Collector(4), None) is None
    assert [e.step for e in receive([TEL, b"1", b"1", b"[1]", ONE], Collector(4), None)] == [0]


def test_a_newer_ranks_longer_record_is_read_as_far_as_known_and_an_older_shorter_one_gets_defaults():
    event = done(1, 0)
    longer = pack(event) + struct.pack("<d", 42.0)  # a field this ddptop does not know, appended
    assert take(1, b"[2]", block([longer, longer], size=193 + 8)) == [event, event]
    older = pack(event)[:-8]  # no threads_s yet (issue 42's first change): 0, "not measured"
    got = take(1, b"[1]", block([older]))
    assert got == [dataclasses.replace(event, threads_s=0.0)]


def test_json_steps_and_records_mix_in_one_batch_and_a_bad_json_event_costs_itself():
    items = [1, done(1, 5).to_wire(), {**done(1, 6).to_dict(), "iter_s": "x"}, 1]
    got = take(1, json.dumps(items).encode(), block([pack(done(1, 4)), pack(done(1, 7))]))
    assert [e.step for e in got if isinstance(e, StepDone)] == [4, 5, 7]
    assert [e.count for e in got if isinstance(e, EventsRefused)] == [1]


def test_the_wire_form_of_every_kind_is_still_its_dicts_values():
    """Event.to_wire skips to_dict for speed (issue 42): it must give what to_dict gives, in order."""
    event = done(1, 3)
    assert event.to_wire() == list(event.to_dict().values())
    spans = StepSpans(1, 2, 0, T0, (Span("fwd", "forward", 0.0, 0.001, 1, 2, 3),))
    assert spans.to_wire() == list(spans.to_dict().values())
