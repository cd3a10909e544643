"""Which segments a report shows: by default those with at least warm-up + 3 steps (and it says which it left out),
`--segments` to choose; bad lists are one line and exit code 2."""

from __future__ import annotations

import json
import sqlite3

from ddptop.cli import main
from test_report import table_rows


def _lengths(record) -> dict[int, int]:
    db = sqlite3.connect(record)
    return {seg: hi - lo + 1 for seg, lo, hi in db.execute("SELECT segment, min(step), max(step) FROM steps GROUP BY "
                                                          "segment")}


def test_the_live_switch_made_one_short_segment(switched):
    record, answers = switched
    lengths = _lengths(record)
    assert sorted(lengths) == [0, 1, 2]
    assert lengths[1] < 1 + 3 <= min(lengths[0], lengths[2]), lengths  # warm-up 1 (no sweep) + 3
    assert [a["state"] for _, a in answers] == ["applied", "applied"]


def test_by_default_short_segments_are_left_out_and_the_report_says_so(switched, tmp_path, capsys):
    record, _ = switched
    out = tmp_path / "default"
    assert main(["report", str(record), "-o", str(out), "--formats", "png"]) == 0
    assert [r["segment"] for r in table_rows(out / "report.md")] == ["0", "2"]
    err = capsys.readouterr().err
    page = (out / "report.md").read_text()
    for text in (err, page):
        assert "segment 1 (gather-scatter batch=16)" in text and "fewer than warm-up 1 + 3" in text
        assert "--segments all" in text
    figures = json.loads((out / "figures.json").read_text())
    assert figures["step_time"]["axes"][0]["xticklabels"] == ["allreduce", "ddp"]
    assert [s["name"] for s in figures["loss"]["axes"][0]["segments"]] == ["allreduce", "ddp"]


def test_segments_all_and_a_chosen_list(switched, tmp_path):
    record, _ = switched
    assert main(["report", str(record), "-o", str(tmp_path / "all"), "--segments", "all", "--formats", "png"]) == 0
    assert [r["segment"] for r in table_rows(tmp_path / "all" / "report.md")] == ["0", "1", "2"]
    figures = json.loads((tmp_path / "all" / "figures.json").read_text())
    assert figures["step_time"]["axes"][0]["xticklabels"] == ["allreduce", "gather-scatter", "ddp"]
    assert main(["report", str(record), "-o", str(tmp_path / "some"), "--segments", "1-2", "--formats", "png"]) == 0
    assert [r["segment"] for r in table_rows(tmp_path / "some" / "report.md")] == ["1", "2"]
    assert "left out: segment" not in (tmp_path / "some" / "report.md").read_text()


def test_bad_segment_lists_are_one_line_and_exit_2(switched, tmp_path, capsys):
    record, _ = switched
    for spec, words in (("1,x", "'x' is not a segment number"), ("3-1", "'3-1' is not"), ("7", "has no segment 7")):
        assert main(["report", str(record), "-o", str(tmp_path / "x"), "--segments", spec]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("ddptop: ") and words in err[0], err
