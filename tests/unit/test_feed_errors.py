"""The front's feed says what fails: a hub whose receiving thread fails, a sink that raises."""

from __future__ import annotations

import io
import threading
import time

from ddptop.events import LogLine
from ddptop.front.feed import Feed
from ddptop.front.pipeline import compose
from ddptop.front.headless import HeadlessPrinter
from ddptop.record.reader import Recording
from ddptop.record.sqlite import RecordingWriter, base_meta
from jobchannel import Served, job_keys

JOB = job_keys("feed-errors-token", "cd" * 16)


def test_a_hub_that_fails_is_said_once_on_screen_in_the_log_and_in_the_recording(tmp_path):
    """The hub's sockets go away under a live source (its ZeroMQ context terminated): its thread stops; without a
    word the screen would just stop moving."""
    served = Served(JOB)
    out = io.StringIO()
    printer = HeadlessPrinter(out=out, bar=False)
    path = str(tmp_path / "run.db")
    recorder = RecordingWriter(path, base_meta({}, {}))
    feed = Feed(served.hub.source, [recorder], state=printer.state)
    feed.pump()
    assert out.getvalue() == ""
    threading.Thread(target=served.hub.server.ctx.term, daemon=True).start()  # the thread's poll fails: ETERM
    deadline = time.monotonic() + 10
    while "failed" not in out.getvalue() and time.monotonic() < deadline:
        feed.pump()
        time.sleep(0.05)
    for _ in range(10):  # said once, not at every pump
        feed.pump()
        time.sleep(0.05)
    feed.stop()
    recorder.close()
    lines = out.getvalue().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("ddptop error: receiving the ranks' telemetry failed: "), lines
    assert set(lines) <= set(printer.state.snapshot().notices)  # what the screen shows
    with Recording.open(path) as rec:
        logged = [e for e in rec.events() if isinstance(e, LogLine)]
    assert len(logged) == len(lines) and all("telemetry failed" in e.message for e in logged)


class Refusing:
    """A sink with a bug: it raises on every batch, with the batch's length in the message."""

    def handle(self, events):
        raise ValueError(f"cannot take {len(events)} events")


def test_sink_failures_are_said_as_they_happen_once_each_and_counted_at_the_end(capsys):
    feed = Feed(None, [Refusing()])
    for batch in ([1], [2], [3], [4, 5], [6]):
        feed.push(batch)
    during = capsys.readouterr().err.splitlines()
    assert during == ["ddptop: while showing the run: Refusing: ValueError: cannot take 1 events (going on)",
                      "ddptop: while showing the run: Refusing: ValueError: cannot take 2 events (going on)"]
    feed.stop()
    assert capsys.readouterr().err.splitlines() == [
        "ddptop: while showing the run: Refusing: ValueError: cannot take 1 events (5 failures in all)"]


def test_the_other_sinks_still_get_every_event_when_one_fails():
    feed = compose(None, sinks=[Refusing()])
    for i in range(3):
        feed.push([LogLine(0, "warning", f"line {i}", 0.0)])
    state = feed.state
    assert list(state.snapshot().notices)[-3:] == ["rank 0 warning: line 0", "rank 0 warning: line 1",
                                                   "rank 0 warning: line 2"]
