"""Issue 26 on the shipped cs744-lab recording, as a student hands it in: the report flags a loss that rises (a copy
whose losses were made to rise; the shipped run, at lr 0.01, learns and is not flagged), which segment is which part of the assignment, how precise 4 steps per part are (the rounds'
spread, from SQL), one bandwidth unit, a readable segment table; a sweep states no difference within its noise."""

from __future__ import annotations

import json
import re
import sqlite3
import statistics
from pathlib import Path

import pytest

from ddptop.cli import main
from ddptop.metrics.buckets import same_layout

ROOT = Path(__file__).resolve().parents[2]
LAB = ROOT / "recordings" / "cs744-lab.db"
WARMUP = 2  # the profile's sweep warm-up


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    if not LAB.exists():
        pytest.skip("recordings/cs744-lab.db is not in this checkout")
    out = tmp_path_factory.mktemp("cs744-lab")
    assert main(["report", str(LAB), "-o", str(out), "--formats", "png"]) == 0
    return (out / "report.md").read_text(), json.loads((out / "figures.json").read_text())


def _sql(query: str, *args) -> list[tuple]:
    with sqlite3.connect(f"file:{LAB}?mode=ro", uri=True) as db:
        return db.execute(query, args).fetchall()


def test_the_shipped_run_learns_and_is_not_flagged(report):
    text, figures = report
    means = dict(_sql("SELECT step, avg(loss) FROM steps GROUP BY step ORDER BY step"))
    last = max(means)
    assert statistics.fmean(means[s] for s in range(last - 4, last + 1)) < 0.5 * means[0]  # lr 0.01 learns
    assert "Training went wrong" not in text and "Flagged" not in figures["loss"]["finding"]


def test_a_rising_loss_is_flagged_with_the_recordings_numbers(tmp_path):
    """The same recording with its losses made to rise (loss × (1 + step), as lr 0.1 did: 2.5 → 17 by step 10)."""
    copy = tmp_path / "rising.db"
    copy.write_bytes(LAB.read_bytes())
    with sqlite3.connect(copy) as db:
        db.execute("UPDATE steps SET loss = loss * (1 + step)")
        means = dict(db.execute("SELECT step, avg(loss) FROM steps GROUP BY step ORDER BY step").fetchall())
    out = tmp_path / "out"
    assert main(["report", str(copy), "-o", str(out), "--formats", "png"]) == 0
    text, figures = (out / "report.md").read_text(), json.loads((out / "figures.json").read_text())
    start, recent = min(means[s] for s in range(3)), statistics.fmean(means[s] for s in range(5, 10))
    (warning,) = [line for line in text.splitlines() if "Training went wrong" in line]
    assert f"step 10): loss {recent:.2f} (mean of the last 5 steps) is {recent / start:.1f}× its start " \
           f"({start:.2f}" in warning and "above chance (ln 10 = 2.30" in warning, warning
    assert "Flagged at step 10" in figures["loss"]["finding"]


def test_the_report_names_the_assignments_parts_and_what_four_steps_cost(report):
    text, _ = report
    parts = {"single": "Part 1", "gather-scatter": "Part 2a", "allreduce": "Part 2b", "ddp": "Part 3"}
    want: dict[str, list[int]] = {}
    for segment, config in _sql("SELECT segment, config FROM segments ORDER BY segment"):
        want.setdefault(parts[json.loads(config)["strategy"]], []).append(segment)
    section = text.split("## Handing in (CS744 assignment 2)", 1)[1].split("\n## ", 1)[0]
    for part, segments in want.items():
        assert re.search(rf"^\| {part} \| [^|]+ \| {', '.join(map(str, segments))} \| ", section, re.M), part
    # the rounds' spread: each segment's slowest rank's mean step time over its measured steps, by SQL
    slowest = {}
    for segment, first in _sql("SELECT segment, step FROM segments"):
        slowest[segment] = max(mean for (mean,) in _sql(
            "SELECT avg(iter_s) FROM steps WHERE segment = ? AND step >= ? AND sampled = 0 GROUP BY rank",
            segment, first + WARMUP))
    spread = max((max(v) - min(v)) / statistics.fmean(v) for v in
                 ([slowest[s] for s in segs] for segs in want.values()))
    assert f"averaged 4 measured step(s) per segment; the course averages 39" in section
    assert f"differed by up to {100 * spread:.1f}%" in section
    assert "--profile cs744-lab-course" in section and "--dataset cifar10 --data-dir DIR" in section


def test_one_bandwidth_unit_and_a_table_a_student_can_read(report):
    text, _ = report
    header = next(line for line in text.split("## Per segment", 1)[1].splitlines() if line.startswith("| segment"))
    assert len(header.strip("|").split("|")) <= 15 and "all-reduce bus Gbit/s" in header
    assert "GB/s" not in text  # lab.md says Gbit/s too
    assert "ring bus Gbit/s" in (ROOT / "docs" / "reports" / "cs744-lab" / "lab.md").read_text()


def test_a_bucket_sweep_that_changes_nothing_is_recognized_on_the_real_models():
    """The tiny model's gradients are one bucket at 5-50 MB (the issue's sweep); VGG-11's are not (5 MB: five)."""
    from ddptop.train.models import build_model, layer_param_counts

    tiny, vgg = (layer_param_counts(build_model(name)) for name in ("tiny", "vgg11"))
    assert "the same 1 bucket" in same_layout(tiny, 4, [5, 10, 25, 50])
    assert same_layout(vgg, 4, [5, 10, 25, 50]) is None
    assert same_layout(tiny, 4, [25]) is None  # one size is no sweep


def _apart(a: list[float], b: list[float]) -> bool:
    """Two boxes (x0, y0, x1, y1, figure pixels, as matplotlib drew them) that do not intersect."""
    return a[2] <= b[0] or b[2] <= a[0] or a[3] <= b[1] or b[3] <= a[1]


def test_figures_keep_their_labels_clear_and_footnotes_only_for_what_is_drawn(report):
    _, figures = report
    legends = [a["legend_box"] for a in figures["system"]["axes"] if a["legend_box"]]
    assert len(legends) >= 3 and all(_apart(a, b) for i, a in enumerate(legends) for b in legends[i + 1:]), legends
    # breakdown.png's lower y-label on one line ran into its own axes' first category name (read back before the
    # layout's last step, its box sat 96 px right of where it was drawn, and this passed on that label too)
    upper, lower = figures["breakdown"]["axes"]
    for ticks in (upper["xticklabels_box"], lower["xticklabels_box"]):
        assert _apart(lower["ylabel_box"], ticks), (lower["ylabel_box"], ticks)
    nic = figures["bytes_per_step"]["axes"][1]
    drawn = [h for bars in nic["bars"] for h in bars["height"]]
    assert all(h == h for h in drawn)  # every interface counted every segment: no n/a bar ...
    assert not any(n.startswith("n/a") for n in figures["bytes_per_step"]["notes"])  # ... so no n/a footnote
