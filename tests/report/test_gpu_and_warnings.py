"""What a report adds when the recording holds GPU readings or a warning: seed 004's GPU table per configuration,
a GPU panel over time, and a ModelsDiverged event as a warning at the top. The recording is the real smoke sweep
rewritten through the real RecordingWriter, each system sample given a GPU reading and one ModelsDiverged added
(this machine has no GPU)."""

from __future__ import annotations

import dataclasses
import json
import re

import pytest

from ddptop.cli import main
from ddptop.events import GpuStat, ModelsDiverged, RankJoined, StepDone, SystemSample
from ddptop.record.reader import Recording
from ddptop.record.sqlite import RecordingWriter
from test_report import table_rows

MIB = 2**20
GPU = {0: (3000, 41.0), 1: (2500, 63.0)}  # rank → (MiB used, % util), the same in every sample of that rank
EVIL = "evil<b>$x^2$|`*h*`"  # rank 1's host name: markup, mathtext and a table pipe, all to be shown as written


@pytest.fixture(scope="module")
def with_gpus(smoke, tmp_path_factory):
    record, _ = smoke
    folder = tmp_path_factory.mktemp("gpu")
    path = folder / "gpu.db"
    with Recording.open(str(record)) as rec:
        events, meta = list(rec.events()), dict(rec.meta)
    writer = RecordingWriter(str(path), {k: meta[k] for k in ("config", "rendezvous", "argv", "versions", "created")},
                             clock="events")  # a rewritten recording keeps its events' times
    out = []
    for e in events:
        if isinstance(e, (RankJoined, SystemSample)) and e.rank == 1:
            e = dataclasses.replace(e, host=EVIL)
        if isinstance(e, SystemSample):
            used, util = GPU[e.rank]
            e = dataclasses.replace(e, gpus=(GpuStat(0, "NVIDIA H100 80GB HBM3", util, used * MIB, 81559 * MIB,
                                                     312.0, 61.0),), gpu_status="ok")
        out.append(e)
        if isinstance(e, StepDone) and e.step == 20 and e.rank == 1:
            out.append(ModelsDiverged(segment=e.segment, step=20, where="segment start",
                                      fingerprints={"0": "a" * 64, "1": "b" * 64}, t=e.t))
    writer.handle(out)
    writer.close()
    report = folder / "report"
    assert main(["report", str(path), "-o", str(report), "--formats", "png"]) == 0
    return report


def test_the_gpu_table_has_every_configuration_and_rank(with_gpus):
    text = (with_gpus / "report.md").read_text()
    section = text.split("## GPU memory and utilization per configuration", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| ") and "NVIDIA" in line]
    assert "GPU memory-usage" in section and "volatile GPU-util" in section
    # a segment has GPU rows where it has system samples: where the per-segment table shows a CPU %
    sampled = {r["segment"] for r in table_rows(with_gpus / "report.md") if r["CPU %"] != "–"}
    assert sampled and {line.split("|")[1].strip() for line in rows} == sampled
    assert len(rows) >= len(sampled)
    for line in rows:
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip("|"))]  # "\|": a pipe in a cell
        rank = int(cells[2].split()[0])
        used, util = GPU[rank]
        assert cells[4] == f"{used} MiB / 81559 MiB"
        assert cells[5].startswith(f"{util:.0f}% ")


def test_the_system_figure_gains_a_gpu_panel(with_gpus):
    figures = json.loads((with_gpus / "figures.json").read_text())
    gpu = figures["system"]["axes"][-1]
    assert gpu["ylabel"] == "GPU utilization, %"
    for line in gpu["lines"]:
        assert set(line["y"]) == {GPU[int(line["label"].split()[1])][1]}


def test_models_that_differ_are_a_warning_at_the_top(with_gpus):
    text = (with_gpus / "report.md").read_text()
    first = text.split("## What ran", 1)[0]
    assert "> ⚠" in first and "**Warning:** models differ at the" in first
    assert "segment start of segment 2 (step 20)" in first
    assert "ranks 0: aaaaaaaaaaaa; ranks 1: bbbbbbbbbbbb" in first
    assert "⚠" in (with_gpus / "report.html").read_text()


def test_a_host_name_from_the_recording_is_shown_as_written_never_as_markup(with_gpus):
    text = (with_gpus / "report.md").read_text()
    assert "evil\\<b\\>$x^2$\\|\\`\\*h\\*\\`" in text and "evil<b>" not in text
    html = (with_gpus / "report.html").read_text()
    assert "evil&lt;b&gt;$x^2$|`*h*`" in html and "evil<b>" not in html
    legend = json.loads((with_gpus / "figures.json").read_text())["cpu_memory"]["axes"][0]["legend"]
    assert f"rank 1 ({EVIL})" in legend  # drawn as text: no mathtext, no error
