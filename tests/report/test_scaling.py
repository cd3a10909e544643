"""Several world sizes in one report: HPML Lab 4's tables 1-3 and the scaling figure, from a real 1-rank run and the
real 2-rank smoke sweep, checked against the per-segment rows of the same report."""

from __future__ import annotations

import json

import pytest

from ddptop.cli import main
from test_report import table_rows

CONFIG = "ddp bucket=25MB batch=32"


def _table(text: str, caption: str) -> list[dict[str, str]]:
    lines = []
    for line in text.split(caption, 1)[1].splitlines()[1:]:
        if line.startswith("|"):
            lines.append(line)
        elif lines:
            break
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    return [dict(zip(header, (c.strip() for c in line.strip("|").split("|")))) for line in lines[2:]]


@pytest.fixture(scope="module")
def scaled(smoke, one_rank, tmp_path_factory):
    out = tmp_path_factory.mktemp("scaling") / "report"
    # PNG and SVG: the figure test below looks for both; no PDF, which nothing here reads
    assert main(["report", str(one_rank), str(smoke[0]), "-o", str(out), "--formats", "png,svg"]) == 0
    return out


def test_hpml_tables_follow_the_per_segment_rows(scaled):
    text = (scaled / "report.md").read_text()
    rows = {(r["ranks"], r["config"]): r for r in table_rows(scaled / "report.md")}
    one, two = rows[("1", CONFIG)], rows[("2", CONFIG)]
    t1 = {r["ranks"]: r for r in _table(text, "**Table 1**")}
    speedup = float(two["img/s"]) / float(one["img/s"])
    assert float(t1["1"][f"{CONFIG}: speedup"]) == 1.0
    assert float(t1["2"][f"{CONFIG}: speedup"]) == pytest.approx(speedup, rel=0.01)
    # an epoch: 1280 images (1 rank: 40 steps of 32; 2 ranks: 20 steps of 2 × 32) at each run's img/s
    assert float(t1["2"][f"{CONFIG}: time (s)"]) == pytest.approx(1280 / float(two["img/s"]), rel=0.01)
    (t2,) = _table(text, "**Table 2**")
    # per step: 4 decimals in the segment table (× 20 steps: ±0.001); per epoch: 3 significant digits (±0.5%)
    for column, per_step in (("comm (s)", "comm s"), ("compute (s)", "compute s")):
        assert float(t2[f"{CONFIG}: {column}"]) == pytest.approx(float(two[per_step]) * 20, rel=0.006, abs=1.1e-3)
    (t3,) = _table(text, "**Table 3**")
    assert t3[f"{CONFIG}: bandwidth (Gbit/s)"] == two["all-reduce bus Gbit/s"]
    assert "1" not in {r["ranks"] for r in _table(text, "**Table 2**")}  # one rank has nothing to communicate


def test_the_scaling_figure_draws_the_tables_speedup(scaled):
    text = (scaled / "report.md").read_text()
    t1 = {r["ranks"]: r for r in _table(text, "**Table 1**")}
    figures = json.loads((scaled / "figures.json").read_text())
    speedup = next(line for line in figures["scaling"]["axes"][0]["lines"] if line["label"] == CONFIG)
    assert speedup["x"] == [1.0, 2.0]
    assert speedup["y"][1] == pytest.approx(float(t1["2"][f"{CONFIG}: speedup"]), abs=0.006)
    for name in ("loss-one", "loss-smoke", "network-smoke", "system-one"):
        assert (scaled / f"{name}.png").exists() and (scaled / f"{name}.svg").exists()
