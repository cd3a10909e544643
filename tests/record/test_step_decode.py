"""A step row's whole-row test (record/schema.py decode_step) decodes exactly as the value-by-value checks do: the
same StepDone for a row ddptop wrote, the same error for a row it did not; and a report reads the steps once."""

from __future__ import annotations

import dataclasses
import math
import random
from pathlib import Path

import pytest

from ddptop.events import StepDone
from ddptop.record import schema
from ddptop.record.schema import EventDecodeError

ROOT = Path(__file__).resolve().parents[2]
GOOD = (1, 20, 0, 2, 1234.5, 0.21, 0.01, 0.12, 0.08, 0.03, 0.6, 64, 2.25, 36924456, 40000000, 40000000, 1,
        0.02, 0.07, 0.01, 0.001, 0.0, 0.0, 512, 0.0004)


def checked(row):
    """The value-by-value path: what decode_step returned for every row before the whole-row test."""
    try:
        return StepDone(*schema._typed(schema._STEP_CHECKS, row))
    except EventDecodeError as exc:
        return type(exc), str(exc)


def fast(row):
    try:
        return schema.decode_step(row)
    except EventDecodeError as exc:
        return type(exc), str(exc)


def test_a_good_row_decodes_to_its_values():
    step = schema.decode_step(GOOD)
    assert isinstance(step, StepDone) and step.sampled is True and dataclasses.astuple(step)[:16] == GOOD[:16]
    assert step == checked(GOOD) and type(step.sampled) is bool


BAD = [None, math.nan, math.inf, -math.inf, 1e308, -1e308, 2, 0, 1, 1.0, 0.5, True, False, "1", b"1", 7 ** 40]


@pytest.mark.parametrize("value", BAD, ids=repr)
def test_every_odd_value_in_every_column_decodes_as_the_checks_decode_it(value):
    for i in range(len(GOOD)):
        row = GOOD[:i] + (value,) + GOOD[i + 1:]
        assert repr(fast(row)) == repr(checked(row)), (dataclasses.fields(StepDone)[i].name, value)


def test_random_rows_and_wrong_shapes_decode_as_the_checks_decode_them():
    rng = random.Random(5)
    for _ in range(3000):
        row = tuple(rng.choice(BAD) if rng.random() < 0.15 else v for v in GOOD)
        assert repr(fast(row)) == repr(checked(row)), row
    for row in (GOOD[:-1], GOOD + (0.0,), list(GOOD), (), (1e308,) * len(GOOD)):
        assert repr(fast(row)) == repr(checked(row)), row


def test_the_report_reads_the_steps_once_and_predicts_what_two_reads_did(monkeypatch):
    """The what-if model's table is fed by the same read as the report's statistics (runs.load): its predictions
    are those of the table read on its own (record.whatif on rec.segment_figures())."""
    from ddptop.record import whatif
    from ddptop.record.reader import Recording
    from ddptop.report import runs

    path = str(ROOT / "recordings" / "whatif-lab.db")
    with Recording.open(path) as rec:
        bests, versus = whatif.bests(rec), whatif.versus(rec)
    reads, original = [], Recording.step_events
    monkeypatch.setattr(Recording, "step_events", lambda self, *a, **k: reads.append(a) or original(self, *a, **k))
    run = runs.load(path)
    assert len(reads) == 1
    assert bests and run.predicted == bests
    assert versus is not None and run.versus == versus


def test_a_step_names_no_rate_of_its_own_and_recordings_from_before_still_open():
    """StepDone carries the step's batch and time, never a rate of its own (the glossary's img/s is a window's images
    over that window's time, metrics.Window); the property it had is gone. A recording made before opens as it did,
    a step dict holding an `images_per_s` (none was ever written, but a rank or file may hold one) decodes with it
    ignored, and steps.csv's rate column is still the step's batch over its time, by SQL on the shipped recording."""
    import sqlite3

    from ddptop.events import event_from_dict
    from ddptop.record import export
    from ddptop.record.reader import Recording

    assert not hasattr(StepDone, "images_per_s") and "images_per_s" not in schema.STEP_FIELDS
    step = schema.decode_step(GOOD)
    assert event_from_dict({**step.to_dict(), "images_per_s": 2.5}) == step
    path = ROOT / "recordings" / "live-switch.db"
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
        truth = {(r, s): (b / t if t > 0 else 0.0) for r, s, b, t in
                 db.execute("SELECT rank, step, batch_size, iter_s FROM steps")}
    rec = Recording.open(str(path))
    try:
        steps = list(rec.step_events())
        assert len(steps) == len(truth) > 100 and all(isinstance(d, StepDone) for d in steps)
        rows = list(export.step_rows(rec))
    finally:
        rec.close()
    assert "images_per_s" in export.STEP_COLUMNS and len(rows) == len(truth)
    for row in rows:
        assert row["images_per_s"] == pytest.approx(truth[row["rank"], row["step"]], rel=1e-6), row
