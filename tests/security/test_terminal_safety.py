"""Escape sequences injected into every string a recording (or the store) can carry never reach a terminal raw.

The recording is written as a hostile front would write it (raw strings, straight into the file); then
info, replay (headless and the screen), export, report and the live printer each show it.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys

import pytest

from ddptop.front.pipeline import compose
from ddptop.events import (ConfigApplied, ControlRefused, EpochDone, LogLine, NicStat, RankJoined, RankLost,
                           RunFinished, RunStarted, Span, StepDone, StepSpans, SystemSample, decode_events,
                           encode_events)
from ddptop.front.headless import HeadlessPrinter
from ddptop.record.sqlite import RecordingWriter, base_meta
from ddptop.safe import clean
from test_run_cli import DDPTOP

BAD = "\x1b]0;owned\x07\x1b[2J\x1b[31mred\u202egnp.exe\x9b1m\x00"
CONTROL = ("\x1b", "\x07", "\u202e", "\x9b", "\x00")
T0 = 1.7e9


def hostile_events() -> list:
    nic = NicStat("eth" + BAD, 1.0, 1.0, 1, 1, 1, 1, 0, 0, 0, 0, 1.0, 1.0)
    config = {"strategy": "ddp", "bucket_mb": 25.0, "async_op": False, "batch_size": 16, "lr": 0.1, BAD: BAD}
    events = [RankJoined(r, 2, "host" + BAD, 1, "cpu" + BAD, "gloo" + BAD, 1, "2" + BAD, "0" + BAD, "local" + BAD, T0)
              for r in (0, 1)]
    events += [
        RunStarted("tiny" + BAD, "synthetic" + BAD, 2, "ddp", 25.0, False, 16, 0.1, 100, 400, 2,
                   (("layer" + BAD, 50),), 20, T0 + 0.1, 4, 0),
        ConfigApplied(0, 0, 0, config, 0, "start", T0 + 0.2),
        ConfigApplied(0, 2, 1, config, 3, "ctl@" + BAD, T0 + 0.3),
        ControlRefused(4, "refused " + BAD, T0 + 0.4),
        LogLine(1, "error" + BAD, "message " + BAD, T0 + 0.5),
        RankLost(1, 2, "reason " + BAD, T0 + 0.6),
        EpochDone(0, 0, 3, 1.0, 1, 2, T0 + 0.7),
    ]
    for step in range(4):
        for rank in (0, 1):
            events.append(StepDone(rank, step, 0, 0, T0 + 1 + step, 0.1, 0.01, 0.05, 0.03, 0.01, 0.5, 16, 2.0, 400,
                                   400, 400, True))
            events.append(StepSpans(rank, step, 0, T0 + 1 + step, (Span("fwd", "layer" + BAD, 0.0, 0.01),
                                                                   Span("comm", "bucket " + BAD, 0.01, 0.01, 400))))
            events.append(SystemSample(rank, "host" + BAD, T0 + 1 + step, 1.0, 1.0, 1, 1, 2, "eth" + BAD, (nic,)))
    events += [RunFinished(r, 4, "error: " + BAD, T0 + 6) for r in (0, 1)]
    return events


@pytest.fixture(scope="module")
def hostile(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("hostile") / "hostile.db")
    writer = RecordingWriter(path, base_meta({"model": "tiny" + BAD, "sync": {"strategy": BAD}},
                                             {"source": BAD, "world_size": 2}, ["ddptop", BAD]))
    writer._meta["hosts"] = [BAD]
    writer.handle(hostile_events())
    writer.close()
    return path


def assert_safe(text: str, shown: bool = True) -> None:
    assert text.strip() or not shown, "nothing was shown"
    for char in CONTROL:
        assert char not in text, f"{char!r} reached the terminal"


def test_the_sanitizer_escapes_every_control_character():
    assert clean("a\x1b[2Jb\u202ec\nd\x9b\udcff") == "a\\x1b[2Jb\\u202ec\\x0ad\\x9b\\udcff"
    assert clean("x" * 10, limit=5) == "xxxx…"


@pytest.mark.parametrize("argv", [["info"], ["info", "--json"], ["replay", "--instant", "--log-every", "1"]])
def test_info_and_replay_show_escaped_text(hostile, argv):
    result = subprocess.run(DDPTOP + [*argv[:1], hostile, *argv[1:]], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert_safe(result.stdout)
    assert_safe(result.stderr, shown=False)
    if argv == ["info"]:
        assert "\\x1b]0;owned" in result.stdout  # shown escaped, not dropped: the user sees what was there


def test_export_and_report_write_escaped_text(hostile, tmp_path):
    export = subprocess.run(DDPTOP + ["export", hostile, "--csv", str(tmp_path / "csv")], capture_output=True,
                            text=True, timeout=120)
    assert export.returncode == 0, export.stderr
    for name in ("steps.csv", "system.csv"):
        assert_safe((tmp_path / "csv" / name).read_text())
    report = subprocess.run(DDPTOP + ["report", hostile, "-o", str(tmp_path / "report")], capture_output=True,
                            text=True, timeout=180)
    assert report.returncode == 0, report.stderr
    assert_safe((tmp_path / "report" / "report.md").read_text())
    assert_safe(export.stdout + export.stderr + report.stdout + report.stderr)


def test_the_live_printer_shows_escaped_text_from_the_store():
    """The live path: a batch as the collector decodes it from the store, then the headless printer."""
    out = io.StringIO()
    printer = HeadlessPrinter(every=1, out=out, bar=False)
    printer.handle(decode_events(encode_events(hostile_events())))
    printer.finish(traffic=True)
    assert_safe(out.getvalue())


@pytest.mark.asyncio
async def test_the_screen_shows_escaped_text(hostile):
    from ddptop.record.replay import ReplaySource
    from ddptop.tui.app import DdptopApp

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "tui"))
    from screen_text import screen_text

    source = ReplaySource(hostile, playing=False)
    source.seek_time(source.t_end)
    app = DdptopApp(compose(source))
    try:
        async with app.run_test(size=(160, 48)) as pilot:
            for key in "123456":
                await pilot.press(key)
                await pilot.pause(0.2)
                assert_safe(screen_text(app))
    finally:
        source.close()
