"""`ddptop report` on a real recorded smoke sweep: the table's numbers are the recording's, the figures exist."""

from __future__ import annotations

import sqlite3
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from ddptop.cli import main

SMOKE_SEGMENTS = ["single batch=32", "gather-scatter batch=32", "allreduce batch=32", "allreduce async batch=32",
                  "ddp bucket=25MB batch=32"]
WARMUP, MEASURE = 2, 6  # profiles/smoke.toml


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    folder = tmp_path_factory.mktemp("smoke")
    record = folder / "smoke.db"
    run = subprocess.run([sys.executable, "-m", "ddptop", "--headless", "--profile", "smoke", "--record", str(record)],
                         capture_output=True, text=True, timeout=180)
    assert run.returncode == 0, run.stderr
    out = folder / "report"
    assert main(["report", str(record), "-o", str(out)]) == 0
    return record, out


def table_rows(report: Path) -> list[dict[str, str]]:
    lines = [line for line in report.read_text().splitlines() if line.startswith("| ")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    return [dict(zip(header, (c.strip() for c in line.strip("|").split("|")))) for line in lines[1:]
            if not line.startswith("| config | ranks")]


def test_report_writes_markdown_and_figures(smoke):
    _, out = smoke
    pngs = sorted(p.name for p in out.glob("*.png"))
    assert len(pngs) >= 4 and all((out / p).stat().st_size > 5000 for p in pngs)
    text = (out / "report.md").read_text()
    for png in pngs:
        assert f"({png})" in text


def test_table_numbers_equal_the_recording(smoke):
    record, out = smoke
    rows = table_rows(out / "report.md")
    assert [r["config"] for r in rows] == SMOKE_SEGMENTS
    db = sqlite3.connect(record)
    for row in rows:
        segment = int(row["segment"])
        first = db.execute("SELECT min(step) FROM steps WHERE segment = ?", (segment,)).fetchone()[0]
        measured = db.execute("SELECT step, max(iter_s) FROM steps WHERE segment = ? AND step >= ? GROUP BY step",
                              (segment, first + WARMUP)).fetchall()
        times = [t for _, t in measured]
        assert int(row["steps"]) == len(times) == MEASURE
        assert float(row["mean s/step"]) == pytest.approx(statistics.fmean(times), abs=6e-5)
        assert float(row["median s/step"]) == pytest.approx(statistics.median(times), abs=6e-5)
        tx = db.execute("SELECT avg(tx_bytes), avg(overlap) FROM steps WHERE segment = ? AND step >= ?",
                        (segment, first + WARMUP)).fetchone()
        assert float(row["MB sent/step (formula)"]) == pytest.approx(tx[0] / 1e6, abs=0.006)
        assert float(row["overlap %"]) == pytest.approx(100 * tx[1], abs=0.06)
        last = db.execute("SELECT avg(loss) FROM steps WHERE segment = ? AND step = "
                          "(SELECT max(step) FROM steps WHERE segment = ?)", (segment, segment)).fetchone()[0]
        assert float(row["final loss"]) == pytest.approx(last, abs=6e-5)
    assert rows[0]["MB sent/step (formula)"] == "0.00"  # single sends nothing


def test_several_recordings_give_a_scaling_table(smoke, tmp_path):
    record, _ = smoke
    out = tmp_path / "both"
    assert main(["report", str(record), str(record), "-o", str(out)]) == 0
    text = (out / "report.md").read_text()
    assert "## Scaling" not in text  # the same world size twice is no scaling experiment
    assert text.count("| smoke:") == 2 * len(SMOKE_SEGMENTS)


def test_bad_input_is_one_line(tmp_path, capsys):
    assert main(["report", str(tmp_path / "missing.db"), "-o", str(tmp_path / "x")]) != 0
    assert main(["report", "-o", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err and all(line.startswith("ddptop: ") for line in err) and "Traceback" not in "\n".join(err)
