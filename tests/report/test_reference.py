"""The report's "Beside the published figures" on the shipped cs744-lab recording: this run's column is SQL on the
file, the published columns are the profile's TOML as written, the order sentence says what those numbers say; a
profile name from a recording never picks a file; a malformed table is one line and the report is still written."""

from __future__ import annotations

import json
import sqlite3
import statistics
import sys
from pathlib import Path

import pytest

from ddptop import profiles
from ddptop.cli import main
from ddptop.report.analysis import segment_stats
from ddptop.report.reference import compare, load

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
RECORDING = ROOT / "recordings" / "cs744-lab.db"
WARMUP = 2  # cs744-lab's sweep


def section(report: Path) -> list[dict[str, str]]:
    text = report.read_text().split("## Beside the published figures", 1)[1]
    lines = [line for line in text.split("\n\n")[1:4] if line.startswith("|")][0].splitlines()
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    return [dict(zip(header, (c.strip() for c in line.strip("|").split("|")))) for line in lines[2:]]


def measured_mean(db, segment: int) -> tuple[float, int]:
    """The slowest rank's mean step time over the segment's measured steps, and how many: SQL on the recording."""
    first = db.execute("SELECT step FROM segments WHERE segment = ?", (segment,)).fetchone()[0]
    ranks = [r for (r,) in db.execute("SELECT DISTINCT rank FROM steps WHERE segment = ?", (segment,))]
    times = {r: [t for (t,) in db.execute("SELECT iter_s FROM steps WHERE segment = ? AND rank = ? AND step >= ? "
                                           "AND sampled = 0", (segment, r, first + WARMUP))] for r in ranks}
    slowest = max(times.values(), key=statistics.fmean)
    return statistics.fmean(slowest), len(slowest)


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    if not RECORDING.exists():
        pytest.skip("recordings/cs744-lab.db is not in this checkout")
    out = tmp_path_factory.mktemp("reference")
    assert main(["report", str(RECORDING), "-o", str(out), "--formats", "png"]) == 0
    return out


def test_this_run_is_the_recording_and_the_course_is_the_profile(report):
    rows = section(report / "report.md")
    published = tomllib.loads((ROOT / "ddptop" / "own_profiles" / "cs744-lab.toml").read_text())["reference"]
    db = sqlite3.connect(RECORDING)
    configs = {seg: json.loads(c) for seg, c in db.execute("SELECT segment, config FROM segments")}
    assert len(rows) == len(published[0]["rows"]) == 4
    for row, *theirs in zip(rows, *(p["rows"] for p in published)):
        wanted = {k: v for k, v in theirs[0].items() if k != "step_s"}
        segments = [s for s, c in configs.items() if all(c[k] == v for k, v in wanted.items())]
        assert row["segments"] == ", ".join(map(str, segments)) and len(segments) == 2  # both rounds
        means = [measured_mean(db, s) for s in segments]
        pooled = sum(m * n for m, n in means) / sum(n for _, n in means)
        assert float(row["this run: s/step"]) == pytest.approx(pooled, rel=2e-3)
        for i, p in enumerate(theirs, 1):
            assert float(row[f"[{i}]: s/step"]) == pytest.approx(p["step_s"], rel=2e-3)
    base, speedup = float(rows[0]["this run: s/step"]), next(k for k in rows[0] if k.startswith("this run: speedup"))
    for row in rows:
        assert float(row[speedup].rstrip("×")) == pytest.approx(base / float(row["this run: s/step"]), abs=0.006)


def test_the_order_sentence_says_what_the_numbers_say(report):
    rows = section(report / "report.md")
    text = (report / "report.md").read_text().split("## Beside the published figures", 1)[1].split("##", 1)[0]
    mine = [r["configuration"] for r in sorted(rows, key=lambda r: -float(r["this run: s/step"]))]
    assert "Slowest to fastest, this run: " + " \\> ".join(mine) in text
    theirs = [r["configuration"] for r in sorted(rows, key=lambda r: -float(r["[1]: s/step"]))]
    assert ("[1\\]: the same order" in text) == (theirs == mine)
    drawn = json.loads((report / "figures.json").read_text())["reference"]
    assert "Speedup over" in drawn["finding"] and (report / "reference.png").stat().st_size > 5000


def test_a_recordings_profile_name_never_picks_a_file(tmp_path, monkeypatch):
    (tmp_path / "evil.toml").write_text('[[reference]]\nsource = "x"\nrows = [{ strategy = "ddp", step_s = 1 }]')
    monkeypatch.chdir(tmp_path)
    for name in (str(tmp_path / "evil.toml"), "../" + tmp_path.name + "/evil", "evil", "", "a/b", "x" * 200):
        assert profiles.profile_references(name) == []
    assert profiles.profile_references("cs744-lab")  # a plain name in ddptop's own profiles/


def test_a_malformed_reference_is_one_line_and_the_report_goes_on(tmp_path, monkeypatch, capsys):
    folder = tmp_path / "profiles"
    folder.mkdir()
    (folder / "cs744-lab.toml").write_text('[[reference]]\nsource = "x"\nrows = [{ strategy = "ddp", step_s = "1" }]')
    monkeypatch.setattr(profiles, "OWN_DIR", folder)
    assert load("cs744-lab") == []
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "published figures left out" in err and "step_s must be seconds" in err
    if RECORDING.exists():
        assert main(["report", str(RECORDING), "-o", str(tmp_path / "out"), "--formats", "png"]) == 0
        assert "Beside the published figures" not in (tmp_path / "out" / "report.md").read_text()


def test_rows_no_segment_ran_say_so():
    if not RECORDING.exists():
        pytest.skip("recordings/cs744-lab.db is not in this checkout")
    from ddptop.record.reader import Recording

    with Recording.open(str(RECORDING)) as rec:
        stats = segment_stats(list(rec.events()), warmup=WARMUP)
    rows = (((("strategy", "ddp"),), 0.87), ((("batch_size", 64), ("strategy", "single")), 1.0))
    refs = [profiles.Reference("a course", rows)]
    c = compare("x", refs, stats)
    assert c.rows[1].segments == () and c.rows[1].step_s is None
    assert c.rows[0].segments == (3, 7)
