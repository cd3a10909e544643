"""The "link at its rate" hint on a shaped 2-host lab: the lab records its link's rate, and DDP's one bucket of
the tiny model over a 2 Mbit/s link carries the link's rate while it communicates. The expectation comes from the
lab's --link and the model's size (the ring's 2(N−1)/N·S each way), not from ddptop."""

from __future__ import annotations

import json
import sqlite3

import pytest

from ddptop.lab.links import parse_link
from ddptop.metrics import hints as rules
from ddptop.record.reader import Recording
from ddptop.report.hints import for_recording
from labs import LAB_REFUSED, LabProcess, inodes, leftovers

pytestmark = pytest.mark.skipif(bool(LAB_REFUSED), reason=LAB_REFUSED or "labs work")
N, LINK = 2, parse_link("2mbit")
S = 83944  # the tiny model's gradient bytes
PROFILE = """
[run]
model = "tiny"
batch_size = 16
synthetic_size = 640
seed = 1
no_eval = true
span_every = 100
[sweep]
warmup = 1
measure = 14
configs = [{ strategy = "ddp", bucket_mb = 25 }]
"""


def test_a_link_that_carries_its_rate_is_named_the_bottleneck(tmp_path):
    """At 2 Mbit/s the ring's 84 KB each way takes 336 ms a step, far longer than gloo's own latency or the ranks'
    skew at a step's end: the rank that waits least communicates at the link's rate."""
    (tmp_path / "p.toml").write_text(PROFILE)
    lab = LabProcess(["--nodes", str(N), "--link", "2mbit", "--profile", str(tmp_path / "p.toml"), "--headless",
                      "--record", str(tmp_path / "run.db")], tmp_path)
    record = lab.record()
    held = inodes(record)
    assert lab.wait(180) == 0, lab.output
    assert leftovers(record, held, tmp_path) == []
    db = sqlite3.connect(f"file:{tmp_path / 'run.db'}?mode=ro", uri=True)
    assert json.loads(db.execute("SELECT value FROM meta WHERE key = 'link'").fetchone()[0])["bits_per_s"] == 2e6
    least = min(c for (c,) in db.execute("SELECT avg(comm_s) FROM steps WHERE step >= 1 AND sampled = 0 "
                                         "GROUP BY rank"))
    db.close()
    ring = 2 * (N - 1) / N * S  # each way, per step
    gradient_share = ring / LINK.bytes_per_s / least  # the gradient alone, by the flag and the model's size
    with Recording.open(str(tmp_path / "run.db")) as rec:
        (segment, found), = for_recording(rec)
    named = {h.name: h for h in found}
    print(f"gradient bytes / least mean comm: {gradient_share:.0%} of {LINK.describe()} (comm {least * 1e3:.0f} ms); "
          + "; ".join(h.line() for h in found))
    assert "link at its rate" in named, (gradient_share, [h.line() for h in found])
    hint = named["link at its rate"].numbers
    assert hint["comm_s"] == pytest.approx(least, rel=1e-9) and hint["rate_bytes_per_s"] == LINK.bytes_per_s
    assert hint["bytes"] == pytest.approx(ring, rel=1e-9) and hint["share"] == pytest.approx(gradient_share, rel=1e-9)
    assert rules.LINK_SHARE <= hint["share"] <= 1.0  # shown clearly, and never above what the link lets by
