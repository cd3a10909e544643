"""The report never states a sample whose own numbers contradict the process or its node (issue 44: "the busiest
rank process reached 1176% of a core" with one torch thread per rank; node CPU at 0% on a saturated machine). The
recording is the committed live-switch.db (2 ranks, one torch thread each) rewritten through the real
RecordingWriter with two of its system samples made such glitches; the expected numbers are SQL on the original."""

from __future__ import annotations

import dataclasses
import json
import sqlite3
from pathlib import Path

import pytest

from ddptop.cli import main
from ddptop.events import SystemSample
from ddptop.record.reader import Recording
from ddptop.record.sqlite import RecordingWriter

SOURCE = Path(__file__).resolve().parents[2] / "recordings" / "live-switch.db"


@pytest.fixture(scope="module")
def glitched(tmp_path_factory):
    folder = tmp_path_factory.mktemp("glitch")
    path = folder / "glitch.db"
    with Recording.open(str(SOURCE)) as rec:
        events, meta = list(rec.events()), dict(rec.meta)
    writer = RecordingWriter(str(path), {k: meta[k] for k in ("config", "rendezvous", "argv", "versions", "created")},
                             clock="events")  # a rewritten recording keeps its events' times
    samples = [i for i, e in enumerate(events) if isinstance(e, SystemSample)]
    hot, idle = samples[len(samples) // 3], samples[2 * len(samples) // 3]
    events[hot] = dataclasses.replace(events[hot], proc_cpu_percent=1176.0)  # 1 torch thread: at most ~400%
    events[idle] = dataclasses.replace(events[idle], node_cpu_percent=0.0)  # its own process ran meanwhile
    assert events[idle].proc_cpu_percent > 0
    writer.handle(events)
    writer.close()
    report = folder / "report"
    assert main(["report", str(path), "-o", str(report), "--formats", "png"]) == 0
    return report, events[hot], events[idle]


def test_the_system_figure_and_its_caption_leave_the_two_glitches_out_and_say_so(glitched):
    report, hot, idle = glitched
    with sqlite3.connect(SOURCE) as con:  # the original's busiest reading, none of them a glitch
        most, rss = con.execute("SELECT max(proc_cpu_percent), max(proc_rss_bytes) FROM system").fetchone()
    figure = json.loads((report / "figures.json").read_text())["system"]
    finding = figure["finding"]
    assert f"The busiest rank process reached {most:.0f}% of a core" in finding, finding
    assert f"the most resident memory was {rss / 1e6:.0f} MB" in finding, finding  # every rank's samples
    assert "1176%" not in finding.split(" left out")[0]
    assert "2 samples whose numbers contradict the process or its node were left out" in finding, finding
    assert f"rank {hot.rank}'s process at 1176% with 1 torch thread" in finding
    assert f"rank {idle.rank}'s node at 0% while its process used {idle.proc_cpu_percent:.0f}%" in finding
    cpu, node = figure["axes"][0], figure["axes"][1]
    assert all(1176.0 not in line["y"] for line in cpu["lines"])
    assert all(0.0 not in line["y"] for line in node["lines"]), node["lines"]
