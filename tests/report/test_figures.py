"""`ddptop report`'s figures on a real recorded smoke sweep: every figure in PNG (≥150 dpi), SVG and PDF, and the
values each figure draws (read back from its matplotlib artists into figures.json) equal the report's table and
SQL on the recording, computed here independently (numpy percentiles, SQL averages)."""

from __future__ import annotations

import json
import sqlite3
import struct

import numpy as np
import pytest

from ddptop.report.markdown import untrusted
from smoke_run import SMOKE_SEGMENTS, WARMUP
from test_report import table_rows

NAMES = ["single", "gather-scatter", "allreduce", "allreduce async", "ddp"]  # what sets each smoke segment apart


@pytest.fixture(scope="module")
def drawn(smoke):
    record, out = smoke
    return record, out, json.loads((out / "figures.json").read_text()), {int(r["segment"]): r for r in
                                                                         table_rows(out / "report.md")}


def _png_dpi(path) -> float:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    at = data.index(b"pHYs")
    per_metre, _, unit = struct.unpack(">IIB", data[at + 4:at + 13])
    assert unit == 1
    return per_metre * 0.0254


def test_every_figure_exists_as_png_svg_and_pdf_and_is_on_the_page(drawn):
    _, out, figures, _ = drawn
    expected = {"step_time", "breakdown", "bytes_per_step", "cpu_memory", "sync_async", "loss", "network", "system"}
    assert expected <= set(figures)
    page = (out / "report.md").read_text()
    html = (out / "report.html").read_text()
    for name, fig in figures.items():
        png, svg, pdf = (out / f"{name}.{ext}" for ext in ("png", "svg", "pdf"))
        assert _png_dpi(png) >= 150 and png.stat().st_size > 20_000
        assert svg.read_text().lstrip().startswith("<?xml") and "<svg" in svg.read_text()[:2000]
        assert pdf.read_bytes()[:5] == b"%PDF-"
        assert f"]({name}.png)" in page and f"]({name}.svg)" in page
        assert fig["finding"] and untrusted(fig["finding"], None) in page  # the "what this shows" line under it
        for ax in fig["axes"]:
            assert ax["ylabel"], (name, ax)  # every axis says what it shows, with a unit
        assert fig["axes"][-1]["xlabel"] or fig["axes"][-1]["xticklabels"], name
    assert html.count("data:image/png;base64,") == len(figures)


def test_step_time_bars_are_the_tables_and_whiskers_the_recordings_p10_p90(drawn):
    record, _, figures, table = drawn
    ax = figures["step_time"]["axes"][0]
    assert ax["xticklabels"] == NAMES
    (bars,) = ax["bars"]
    (whiskers,) = ax["whiskers"]
    db = sqlite3.connect(record)
    for i, segment in enumerate(sorted(table)):
        assert bars["height"][i] == pytest.approx(float(table[segment]["mean s/step (slowest rank)"]), abs=6e-5)
        first = db.execute("SELECT min(step) FROM steps WHERE segment = ?", (segment,)).fetchone()[0]
        per_rank = {rank: [t for (t,) in db.execute(
            "SELECT iter_s FROM steps WHERE segment = ? AND rank = ? AND step >= ? AND sampled = 0",
            (segment, rank, first + WARMUP))] for (rank,) in db.execute("SELECT DISTINCT rank FROM steps")}
        slowest = max(per_rank.values(), key=np.mean)
        assert whiskers["lo"][i] == pytest.approx(np.percentile(slowest, 10), rel=1e-9)
        assert whiskers["hi"][i] == pytest.approx(np.percentile(slowest, 90), rel=1e-9)
    values = bars["height"] + whiskers["lo"] + whiskers["hi"]
    assert ax["yscale"] == ("log" if max(values) / min(values) > 10 else "linear")


def test_breakdown_draws_the_tables_communication(drawn):
    _, _, figures, table = drawn
    shares, seconds = figures["breakdown"]["axes"]
    totals = np.sum([b["height"] for b in shares["bars"]], axis=0)
    assert totals == pytest.approx([100.0] * len(table), abs=1e-6)  # the parts add up to the step
    comm, exposed = seconds["bars"]
    for i, segment in enumerate(sorted(table)):
        assert comm["height"][i] == pytest.approx(float(table[segment]["comm s"]), abs=6e-5)
        assert exposed["height"][i] == pytest.approx(float(table[segment]["exposed comm s"]), abs=6e-5)


def test_bytes_per_rank_are_the_recordings(drawn):
    record, _, figures, table = drawn
    ax = figures["bytes_per_step"]["axes"][0]
    db = sqlite3.connect(record)
    for rank, bars in enumerate(ax["bars"]):
        assert bars["label"] == f"rank {rank}"
        for i, segment in enumerate(sorted(table)):
            first = db.execute("SELECT min(step) FROM steps WHERE segment = ?", (segment,)).fetchone()[0]
            sent = db.execute("SELECT avg(tx_bytes) FROM steps WHERE segment = ? AND rank = ? AND step >= ? AND "
                              "sampled = 0", (segment, rank, first + WARMUP)).fetchone()[0]
            assert bars["height"][i] == pytest.approx(sent / 1e6, rel=1e-9)
    assert [b["height"][0] for b in ax["bars"]] == [0.0, 0.0]  # single sends nothing


def test_loss_line_and_segment_shading_come_from_the_recording(drawn):
    record, _, figures, table = drawn
    ax = figures["loss"]["axes"][0]
    line = next(line for line in ax["lines"] if line["label"] == "mean over ranks")
    db = sqlite3.connect(record)
    rows = db.execute("SELECT step, avg(loss) FROM steps GROUP BY step ORDER BY step").fetchall()
    assert line["x"] == [float(s) for s, _ in rows]
    assert line["y"] == pytest.approx([loss for _, loss in rows], rel=1e-9)
    spans = ax["segments"]
    assert [s["name"] for s in spans] == NAMES
    bounds = db.execute("SELECT segment, min(step), max(step) FROM steps GROUP BY segment ORDER BY segment").fetchall()
    assert [(s["x0"], s["x1"]) for s in spans] == [(lo - 0.5, hi + 0.5) for _, lo, hi in bounds]
    assert len(table) == len(SMOKE_SEGMENTS)


def test_network_lines_are_the_recorded_nic_rates(drawn):
    record, _, figures, _ = drawn
    rx = figures["network"]["axes"][0]
    db = sqlite3.connect(record)
    start = min(db.execute(f"SELECT min(at) FROM {t}").fetchone()[0] for t in ("steps", "spans", "system", "events"))
    for line in rx["lines"]:
        rank = 0 if line["label"].startswith("lo on") else int(line["label"].split()[1])  # lo: its lowest rank
        rows = db.execute("SELECT t, job_iface, nics FROM system WHERE rank = ? ORDER BY seq", (rank,)).fetchall()
        # a row's NICs are lists in NicStat's field order: iface, rx_rate, tx_rate, ...
        rates = [next(n[1] for n in json.loads(nics) if n[0] == iface) / 1e6 for _, iface, nics in rows]
        assert line["y"] == pytest.approx(rates, rel=1e-9)
    assert "shared" in rx["lines"][0]["label"]  # both ranks on one machine: one loopback, said so
    assert start is not None


def test_sync_vs_async_compares_the_two_allreduce_segments(drawn):
    _, _, figures, table = drawn
    ax = figures["sync_async"]["axes"][0]
    assert ax["xticklabels"] == ["sync", "async"]
    by_config = {r["config"]: r for r in table.values()}
    assert ax["bars"][0]["height"] == pytest.approx(
        [float(by_config[c]["mean s/step (slowest rank)"]) for c in ("allreduce batch=32", "allreduce async batch=32")],
        abs=6e-5)
