"""`ddptop report` on a real recorded smoke sweep: the table's numbers are the recording's, the figures exist."""

from __future__ import annotations

import csv
import json
import os
import sqlite3
import subprocess
import statistics
import sys
from pathlib import Path

import pytest

from ddptop.cli import main

from smoke_run import MEASURE, SMOKE_SEGMENTS, WARMUP


def table_rows(report: Path) -> list[dict[str, str]]:
    """The rows of the report's per-segment table (the table under `## Per segment`), by column name."""
    text = report.read_text().split("## Per segment", 1)[1]
    lines = []
    for line in text.splitlines()[1:]:
        if line.startswith("|"):
            lines.append(line)
        elif lines:
            break
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    rows = [dict(zip(header, (c.strip() for c in line.strip("|").split("|")))) for line in lines[2:]]
    assert rows, "the report has no per-segment rows"
    # report.md shows the essential columns; segments.csv beside it every one, the same cells (issue 26)
    with open(report.parent / "segments.csv", newline="") as f:
        full = list(csv.DictReader(f))
    assert len(header) <= 15 and len(full) == len(rows) and len(full[0]) > len(header)
    for mine, theirs in zip(rows, full):
        assert {k: v.replace("\\", "") for k, v in mine.items()} == {k: theirs[k] for k in mine}
    return full


def test_report_writes_markdown_and_figures(smoke):
    _, out = smoke
    pngs = sorted(p.name for p in out.glob("*.png"))
    assert len(pngs) >= 4 and all((out / p).stat().st_size > 5000 for p in pngs)
    text = (out / "report.md").read_text()
    for png in pngs:
        assert f"({png})" in text


def test_table_numbers_equal_the_recording(smoke):
    """Against SQL on the file: a segment's step time is its slowest rank's mean over the measured steps (after
    the warm-up, sampled steps left out), per README's glossary."""
    record, out = smoke
    rows = table_rows(out / "report.md")
    assert [r["config"] for r in rows] == SMOKE_SEGMENTS
    db = sqlite3.connect(record)
    for row in rows:
        segment = int(row["segment"])
        first = db.execute("SELECT min(step) FROM steps WHERE segment = ?", (segment,)).fetchone()[0]
        per_rank = {rank: [t for (t,) in db.execute(
            "SELECT iter_s FROM steps WHERE segment = ? AND rank = ? AND step >= ? AND sampled = 0 ORDER BY step",
            (segment, rank, first + WARMUP))] for (rank,) in db.execute("SELECT DISTINCT rank FROM steps")}
        slowest = max(per_rank.values(), key=statistics.fmean)
        assert int(row["steps"]) == len(slowest) == MEASURE // 2  # span_every=2: every other step is sampled
        assert float(row["mean s/step (slowest rank)"]) == pytest.approx(statistics.fmean(slowest), abs=6e-5)
        assert float(row["median s/step (slowest rank)"]) == pytest.approx(statistics.median(slowest), abs=6e-5)
        mean = statistics.fmean(statistics.fmean(times) for times in per_rank.values())
        assert float(row["mean s/step (mean over ranks)"]) == pytest.approx(mean, abs=6e-5)
        images = db.execute("SELECT sum(batch_size) FROM steps WHERE segment = ? AND step >= ? AND sampled = 0",
                            (segment, first + WARMUP)).fetchone()[0]
        assert float(row["img/s"]) == pytest.approx(images / sum(slowest), abs=0.06)
        tx = db.execute("SELECT avg(tx_bytes), sum(comm_s - exposed_comm_s), sum(comm_s) FROM steps "
                        "WHERE segment = ? AND step >= ? AND sampled = 0", (segment, first + WARMUP)).fetchone()
        assert float(row["MB sent/step (formula)"]) == pytest.approx(tx[0] / 1e6, abs=0.006)
        assert float(row["overlap %"]) == pytest.approx(100 * (tx[1] / tx[2] if tx[2] else 0), abs=0.06)
        last = db.execute("SELECT avg(loss) FROM steps WHERE segment = ? AND step = "
                          "(SELECT max(step) FROM steps WHERE segment = ?)", (segment, segment)).fetchone()[0]
        assert float(row["final loss"]) == pytest.approx(last, abs=6e-5)
    assert rows[0]["MB sent/step (formula)"] == "0.00"  # single sends nothing


def test_several_recordings_give_a_scaling_table(smoke, tmp_path):
    record, _ = smoke
    out = tmp_path / "both"
    assert main(["report", str(record), str(record), "-o", str(out), "--formats", "png"]) == 0
    text = (out / "report.md").read_text()
    assert "## Scaling" not in text  # the same world size twice is no scaling experiment
    assert text.count("| smoke#1:") == text.count("| smoke#2:") == len(SMOKE_SEGMENTS)
    assert "**smoke" not in text and ":**:" not in text  # issue 16: the headline read `**cs744-compare:**:`


def test_formats_png_writes_only_png_and_links_nothing_else(smoke, tmp_path, capsys):
    """`--formats png` (what most tests use: SVG and PDF draw every figure again): only PNGs on disk, the page
    links no SVG/PDF, and the figures' data equal the full report's; a list without png is one line, exit 2."""
    record, full = smoke
    out = tmp_path / "png"
    assert main(["report", str(record), "-o", str(out), "--formats", "png"]) == 0
    assert "figures (PNG)" in capsys.readouterr().out
    made = {p.suffix for p in out.iterdir() if p.suffix in (".png", ".svg", ".pdf")}
    assert made == {".png"} and {p.suffix for p in full.iterdir()} >= {".png", ".svg", ".pdf"}
    text = (out / "report.md").read_text()
    assert ".svg)" not in text and ".pdf)" not in text and ".png)" in text
    drop = lambda figs: {k: {**v, "files": None} for k, v in figs.items()}  # noqa: E731
    assert drop(json.loads((out / "figures.json").read_text())) == drop(json.loads((full / "figures.json").read_text()))
    for spec in ("svg", "png,gif", ""):
        assert main(["report", str(record), "-o", str(tmp_path / "x"), "--formats", spec]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "--formats" in err[0], err


def test_bad_input_is_one_line(tmp_path, capsys):
    missing = tmp_path / "missing.db"
    assert main(["report", str(missing), "-o", str(tmp_path / "x")]) == 6  # README: a recording that cannot be read
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("ddptop: ") and str(missing) in err[0], err
    assert not (tmp_path / "x").exists()
    assert main(["report", "-o", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("ddptop: "), err


def test_a_report_that_cannot_be_written_is_one_line(smoke, tmp_path, capsys):
    record, _ = smoke
    out = tmp_path / "out"
    (out / "step_time.png").mkdir(parents=True)  # a folder where the first figure goes
    assert main(["report", str(record), "-o", str(out)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("ddptop: cannot write the report in "), err


def test_make_reports_regenerates_a_shipped_report_byte_for_byte(tmp_path):
    """scripts/make-reports.sh on one shipped recording (the smallest, live-switch: ~10 s; all ten: 2 min 50 s of CPU)
    writes the very report.md and figures.json that tests/report/golden/ holds (made by `make reports` into
    docs/reports/, inside the repository): its tables first (the shipped report keeps its tables, as
    report/test_report_memory.py checks for cs744-lab), then every line. The one line allowed to differ is the
    glossary link (docs/reference/glossary.md), relative only when the report is written inside the repository (this
    one is not)."""
    import gzip
    import shutil

    root = Path(__file__).resolve().parents[2]
    (tmp_path / "recordings").mkdir()
    (tmp_path / "docs" / "reports").mkdir(parents=True)
    shutil.copy(root / "recordings" / "live-switch.db", tmp_path / "recordings")
    run = subprocess.run(["sh", str(root / "scripts" / "make-reports.sh")], cwd=tmp_path, capture_output=True,
                         text=True, timeout=300, env={**os.environ, "PYTHON": sys.executable})
    assert run.returncode == 0 and run.stdout.strip().splitlines()[-1] == "1 report(s) in docs/reports/", run.stderr
    made, shipped = tmp_path / "docs" / "reports" / "live-switch", root / "tests" / "report" / "golden" / "live-switch"
    golden = gzip.decompress((shipped / "figures.json.gz").read_bytes())  # gzip: 0.12 MB → 0.02 in the repository
    assert (made / "figures.json").read_bytes() == golden
    ours, theirs = (made / "report.md").read_text().splitlines(), (shipped / "report.md").read_text().splitlines()
    tables = lambda lines: [line for line in lines if line.startswith("|")]  # noqa: E731
    # the shipped report keeps its tables (report/test_report_memory.py checks cs744-lab's the same way)
    assert tables(theirs) and tables(ours) == tables(theirs), "live-switch: the report's tables are not the golden's"
    differ = [(a, b) for a, b in zip(ours, theirs) if a != b]
    elsewhere = "docs/reference/glossary.md in ddptop"  # the link written outside the repository
    assert len(ours) == len(theirs) and len(differ) == 1 and elsewhere in differ[0][0], differ


def test_the_report_has_a_hints_section_per_segment_in_markdown_and_html(smoke):
    """Every segment's hints (ddptop.metrics.hints, as `info` gives them) in the page's Hints section, both files;
    a segment without any says so. The smoke sweep's last segment is DDP at 25 MB: the tiny model's 84 KB
    gradient in one bucket (as DDP recorded it)."""
    from ddptop.record.reader import Recording
    from ddptop.report.hints import for_recording

    record, out = smoke
    with Recording.open(str(record)) as rec:
        found = for_recording(rec)
    md = (out / "report.md").read_text().split("## Hints", 1)[1].split("\n## ", 1)[0]
    html_text = (out / "report.html").read_text().split("<h2>Hints</h2>", 1)[1]
    for s, hints in found:
        lines = [f"segment {s.index} ({s.config.describe()}): {h.line()}" for h in hints] or [
            f"segment {s.index} ({s.config.describe()}): no hint"]
        for line in lines:
            assert f"- {line}\n" in md
            assert f"<li>{line.replace('&', '&amp;')}</li>" in html_text.replace("&#x27;", "'")
    assert "one bucket" in [h.name for h in found[-1][1]]
