"""The report compares like with like (issue 44): a real sweep on 2 gloo ranks (the tiny model, DDP 0.05 MB, 1 MB,
then 0.05 MB with accumulation 4 and fp16) and its report. The bucket-size figure and its finding set the two plain
sizes side by side and leave the accumulated, compressed segment out, saying so; its step times are SQL's."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from ddptop.cli import main
from built_once import built_once
from in_process import slowest_rank_means

WARMUP = 2
PROFILE = """[run]
model = "tiny"
batch_size = 16
synthetic_size = 1280
span_every = 2
no_eval = true

[sweep]
warmup = 2
measure = 6
configs = [
  { strategy = "ddp", bucket_mb = 0.05 },
  { strategy = "ddp", bucket_mb = 1 },
  { strategy = "ddp", bucket_mb = 0.05, accum = 4, compress = "fp16" },
]
"""


def _sweep(folder):
    (folder / "sweep.toml").write_text(PROFILE)
    record = folder / "sweep.db"
    run = subprocess.run([sys.executable, "-m", "ddptop", "--headless", "--profile", str(folder / "sweep.toml"),
                          "--local", "2", "--backend", "gloo", "--record", str(record)],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    # the test reads figures.json (what every figure draws): PNG alone, no SVG or PDF drawn for nothing
    assert main(["report", str(record), "-o", str(folder / "report"), "--formats", "png"]) == 0
    return record, folder / "report"


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    return built_once(tmp_path_factory, "like-with-like", _sweep)


def test_the_bucket_size_figure_leaves_an_accumulated_compressed_segment_out_and_says_so(sweep):
    record, report = sweep
    figure = json.loads((report / "figures.json").read_text())["bucket_size"]
    labels = figure["axes"][0]["xticklabels"]
    assert [label.split("\n")[0] for label in labels] == ["0.05 MB", "1 MB"], labels  # segments 0 and 1 only
    truth = slowest_rank_means(record, WARMUP)
    steps = next(b for b in figure["axes"][0]["bars"] if b["label"] == "step (slowest rank)")["height"]
    assert steps == pytest.approx([truth[0], truth[1]], rel=1e-9)
    finding = figure["finding"]
    assert "pooled" not in finding, finding
    assert f"step {truth[0]:.3g} / {truth[1]:.3g} s" in finding, finding
    assert "Segment 2 (ddp bucket=0.05MB fp16 batch=16 accum=4) left out: it ran another accumulation or " \
           "compression" in finding, finding
    assert "accum 1, no compression" in figure["title"], figure["title"]
