"""Files ddptop writes into a folder another user may write (issue 41): the recording's `-reserve` beside it, `export
--csv` and `--chrome-trace`, `report -o`. A link (or a file owned by uid 65534, as the user nobody would plant it)
waiting at the name ddptop writes, or at the partial it wrote first, is never written through: its target keeps its
bytes and the file ddptop meant to write is whole. A planted `-shm`/`-wal` beside a new recording is refused in one
line naming it (SQLite would use or refuse it), exit 6."""

from __future__ import annotations

import csv
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from ddptop.record.reader import Recording
from ddptop.record.sqlite import RESERVE, RecordingWriter

REPO = Path(__file__).resolve().parents[2]
SHIPPED = REPO / "recordings" / "wire-lab.db"
NOBODY = 65534
ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="plants files as another user: needs root")
BYTES = b"root's own file\n"


def _plant(link: Path, victim: Path) -> None:
    link.symlink_to(victim)
    os.lchown(link, NOBODY, NOBODY)


def _victim(folder: Path, name: str = "victim") -> Path:
    victim = folder / name
    victim.write_bytes(BYTES)
    return victim


def _ddptop(*argv: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ddptop", *argv], capture_output=True, text=True, timeout=300,
                          cwd=cwd, env={**os.environ, "PYTHONPATH": str(REPO), "DDPTOP_STATE_DIR": str(cwd / "jobs")})


@ROOT_ONLY
def test_a_link_planted_at_the_recordings_reserve_is_never_written_through(tmp_path):
    """Before: open(FILE-reserve, "wb") followed the link: the target became 256 KiB of zeros."""
    victim = _victim(tmp_path)
    path = tmp_path / "run.db"
    _plant(Path(f"{path}-reserve"), victim)
    writer = RecordingWriter(str(path), {"note": "planted"})
    reserve = Path(f"{path}-reserve")
    assert not reserve.is_symlink() and reserve.stat().st_size == RESERVE and reserve.stat().st_uid == 0
    writer.close()
    assert victim.read_bytes() == BYTES and not reserve.exists()
    with Recording.open(str(path)) as rec:
        assert rec.meta.get("closed") is not None  # a whole recording, closed


@ROOT_ONLY
@pytest.mark.parametrize("side", ["-shm", "-wal"])
def test_a_planted_shm_or_wal_beside_a_new_recording_is_refused_in_one_line_naming_it(tmp_path, side):
    """Before (-shm): exit 6 with SQLite's own words, not naming what was in the way; a planted -wal is read by
    SQLite as the new file's log. Either way the run is refused before any rank starts, and nothing is written
    through the link."""
    victim = _victim(tmp_path)
    record = tmp_path / "run.db"
    _plant(Path(f"{record}{side}"), victim)
    result = _ddptop("--headless", "--local", "1", "--model", "tiny", "--steps", "2", "--record", str(record),
                     cwd=tmp_path)
    assert result.returncode == 6 and result.stderr.count("\n") == 1, (result.returncode, result.stderr)
    assert f"{record}{side} is in the way" in result.stderr and "a link" in result.stderr, result.stderr
    assert victim.read_bytes() == BYTES and not record.exists() and "joined" not in result.stdout


def _rows(path: Path) -> int:
    with open(path, newline="") as f:
        return sum(1 for _ in csv.DictReader(f))


def _partials(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".part"))


@ROOT_ONLY
def test_export_writes_through_no_planted_link_or_partial(tmp_path):
    """Before: DIR/steps.csv.part and OUT.json.part were opened with open(..., "w"): through a planted link."""
    out = tmp_path / "csv"
    out.mkdir()
    victims = {name: _victim(tmp_path, f"victim-{name}") for name in ("steps.csv", "system.csv", "segments.csv")}
    for name, victim in victims.items():
        _plant(out / f"{name}.part", victim)
    _plant(out / "steps.csv", _victim(tmp_path, "victim-final"))  # the name itself too: replaced, not followed
    trace = tmp_path / "trace.json"
    _plant(Path(f"{trace}.part"), _victim(tmp_path, "victim-trace"))
    result = _ddptop("export", str(SHIPPED), "--csv", str(out), "--chrome-trace", str(trace), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    for victim in [*victims.values(), tmp_path / "victim-final", tmp_path / "victim-trace"]:
        assert victim.read_bytes() == BYTES, victim
    with sqlite3.connect(SHIPPED) as db:
        (steps,) = db.execute("SELECT count(*) FROM steps").fetchone()
    assert not (out / "steps.csv").is_symlink() and _rows(out / "steps.csv") == steps
    assert (out / "steps.csv").stat().st_uid == 0 and trace.read_text().startswith('{"displayTimeUnit"')
    assert _partials(out) == sorted(f"{n}.part" for n in victims)  # nobody's links left as they were, none of ours


@ROOT_ONLY
def test_report_writes_through_no_planted_link(tmp_path):
    """Before: report.md, report.html, segments.csv, figures.json and every figure were written through a link
    waiting at their names in the -o folder."""
    out = tmp_path / "report"
    out.mkdir()
    names = ("report.md", "report.html", "segments.csv", "figures.json", "step_time.png", "step_time.svg",
             "breakdown.pdf")
    for name in names:
        _plant(out / name, _victim(tmp_path, f"victim-{name}"))
    result = _ddptop("report", str(SHIPPED), "-o", str(out), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    for name in names:
        assert (tmp_path / f"victim-{name}").read_bytes() == BYTES, name
        assert not (out / name).is_symlink() and (out / name).stat().st_uid == 0, name
    assert (out / "report.md").read_text().startswith("#") and (out / "step_time.png").read_bytes()[:4] == b"\x89PNG"
    assert _partials(out) == []
