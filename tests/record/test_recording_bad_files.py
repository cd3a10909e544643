"""Bad files (truncated, corrupt, empty, foreign, newer) get one line and exit 6 from info, export and replay.

Fuzz-style: a real recording is cut, flipped, zeroed and replaced many ways; every command must either
refuse it with one `ddptop:` line or (for a flip that lands in a value) read it, and never raise.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from ddptop.cli import main
from ddptop.errors import RecordingError
from ddptop.events import StepDone
from ddptop.cli.recordings import reading
from ddptop.record.sqlite import RecordingWriter, base_meta

PAGE = 4096
REPO = Path(__file__).resolve().parents[2]


def commands(path: str, tmp_path) -> list[list[str]]:
    return [["info", path], ["export", path, "--chrome-trace", str(tmp_path / "t.json"), "--csv", str(tmp_path / "c")],
            ["replay", path, "--headless", "--instant"]]


def run_all(path: str, tmp_path, capsys) -> list[tuple[int, str]]:
    """Each command in-process through cli.main: any exception escaping it fails the test (a traceback)."""
    results = []
    for argv in commands(path, tmp_path):
        code = main(argv)
        err = capsys.readouterr().err
        results.append((code, err))
    return results


def assert_refused(results: list[tuple[int, str]], *words: str) -> None:
    for code, err in results:
        lines = [line for line in err.splitlines() if line.startswith("ddptop:") and "replaying" not in line]
        assert code == 6, err
        assert len(lines) == 1 and all(w in lines[0] for w in words), err


@pytest.fixture
def original(recording) -> bytes:
    with open(recording, "rb") as f:
        return f.read()


def mutated(tmp_path, data: bytes, name: str = "bad.db") -> str:
    path = tmp_path / name
    path.write_bytes(data)
    return str(path)


def test_truncated_anywhere(original, tmp_path, capsys):
    cuts = sorted({1, 15, 99, 100, PAGE - 1, PAGE, PAGE + 1, len(original) // 3, len(original) // 2,
                   len(original) - PAGE, len(original) - 1} | set(random.Random(3).sample(range(1, len(original)), 8)))
    for cut in cuts:
        assert_refused(run_all(mutated(tmp_path, original[:cut]), tmp_path, capsys))


def test_empty_random_and_foreign_files(tmp_path, capsys):
    assert_refused(run_all(mutated(tmp_path, b""), tmp_path, capsys), "empty")
    assert_refused(run_all(mutated(tmp_path, random.Random(1).randbytes(20000)), tmp_path, capsys), "not a ddptop")
    assert_refused(run_all(mutated(tmp_path, json.dumps({"traceEvents": []}).encode()), tmp_path, capsys),
                   "not a ddptop")
    other = tmp_path / "other.db"
    db = sqlite3.connect(other)
    db.execute("CREATE TABLE photos (id INTEGER PRIMARY KEY, name TEXT)")
    db.execute("INSERT INTO photos VALUES (1, 'cat.jpg')")
    db.commit()
    db.close()
    assert_refused(run_all(str(other), tmp_path, capsys), "not a ddptop recording", "another kind")
    assert_refused(run_all(str(tmp_path / "missing.db"), tmp_path, capsys), "no such recording")
    assert_refused(run_all(str(tmp_path), tmp_path, capsys), "is a directory")


def with_sql(recording: str, tmp_path, sql: str) -> str:
    path = tmp_path / "changed.db"
    path.write_bytes(open(recording, "rb").read())
    db = sqlite3.connect(path)
    db.execute(sql)
    db.commit()
    db.close()
    return str(path)


@pytest.mark.parametrize("key,words", [("schema_version", ("recording schema 99",)),
                                       ("event_schema", ("event schema 99",))])
def test_newer_schema_is_refused_with_the_reason(recording, tmp_path, capsys, key, words):
    path = with_sql(recording, tmp_path, f"UPDATE meta SET value = '99' WHERE key = '{key}'")
    assert_refused(run_all(path, tmp_path, capsys), "newer ddptop", "upgrade", *words)


def test_a_damaged_event_inside_is_refused_when_read(recording, tmp_path, capsys):
    path = with_sql(recording, tmp_path,
                    "UPDATE events SET data = json_set(data, '$.v', 99) WHERE kind = 'run_started'")
    assert_refused(run_all(path, tmp_path, capsys)[2:], "damaged", "event schema 99 is newer")
    path = with_sql(recording, tmp_path, "UPDATE steps SET loss = 'oops' WHERE step = 3")
    assert_refused(run_all(path, tmp_path, capsys)[1:], "damaged", "expected a number")  # info reads no losses


# root reads every file: as root, the commands run as the user nobody (util-linux's setpriv), who may enter the folder
# but not read the file (mode 0)
AS_NOBODY = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"] if os.geteuid() == 0 else []


@pytest.mark.skipif(bool(AS_NOBODY) and shutil.which("setpriv") is None,
                    reason="setpriv is not installed (apt-get install util-linux): root reads every file")
def test_unreadable_file(recording):
    folder = Path(tempfile.mkdtemp(prefix="ddptop-unreadable-"))  # pytest's tmp_path is root's own (0700)
    try:
        folder.chmod(0o755)
        path = folder / "secret.db"
        path.write_bytes(open(recording, "rb").read())
        path.chmod(0)
        env = {**os.environ, "PYTHONPATH": str(REPO), "HOME": str(folder)}
        results = [subprocess.run([*AS_NOBODY, sys.executable, "-m", "ddptop", *argv], capture_output=True, text=True,
                                  timeout=60, env=env, cwd=folder) for argv in commands(str(path), folder)]
        assert_refused([(r.returncode, r.stderr) for r in results], f"cannot read {path}: Permission denied")
        assert path.read_bytes() == open(recording, "rb").read()  # refused, and never changed
    finally:
        shutil.rmtree(folder)


def test_zeroed_pages(original, tmp_path, capsys):
    pages = len(original) // PAGE
    for page in sorted(set(random.Random(5).sample(range(pages), min(8, pages))) | {0, 1, pages - 1}):
        data = bytearray(original)
        data[page * PAGE:(page + 1) * PAGE] = bytes(PAGE)
        assert_refused(run_all(mutated(tmp_path, bytes(data)), tmp_path, capsys))


def sqlite_sees_damage(data: bytes, tmp_path) -> bool:
    """SQLite's own verdict on a copy, outside ddptop: it cannot open the file or `PRAGMA quick_check` finds a fault."""
    path = tmp_path / "check.db"
    path.write_bytes(data)
    try:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            return db.execute("PRAGMA quick_check").fetchall() != [("ok",)]
        finally:
            db.close()
    except sqlite3.DatabaseError:
        return True


def test_flipped_bytes(original, tmp_path, capsys):
    """README ("Versioned"): info, export and replay first run SQLite's quick_check and read every row, so the same
    damage gets the same verdict from each: exit 6 and one line, the same line from all three, naming the file; or,
    for a flip inside a value that still reads as one, exit 0 from all three. A flip SQLite itself finds (its own
    quick_check, run by the test on a copy) is never read as 0. Never a traceback."""
    rng = random.Random(7)
    refused = seen_by_sqlite = 0
    for n in range(25):
        data = bytearray(original)
        for offset in rng.sample(range(len(data)), rng.choice((1, 4, 64))):
            data[offset] ^= 1 << rng.randrange(8)
        path = mutated(tmp_path, bytes(data), f"flip{n}.db")
        results = run_all(path, tmp_path, capsys)
        codes = {code for code, _ in results}
        assert len(codes) == 1 and codes <= {0, 6}, (n, results)
        damaged = sqlite_sees_damage(bytes(data), tmp_path)
        seen_by_sqlite += damaged
        if codes == {6}:
            refused += 1
            lines = [[line for line in err.splitlines() if line.startswith("ddptop:") and "replaying" not in line]
                     for _, err in results]
            assert all(len(found) == 1 for found in lines), (n, results)
            assert len({found[0] for found in lines}) == 1 and path in lines[0][0], (n, lines)
        else:
            assert not damaged, (n, "SQLite's quick_check finds damage that ddptop read as a recording")
    assert seen_by_sqlite >= 1 and refused >= seen_by_sqlite, (refused, seen_by_sqlite)  # the flips do damage


def test_bad_files_from_a_real_process(original, tmp_path):
    """The same through the `ddptop` command: one line on stderr, exit 6, no traceback."""
    bad = mutated(tmp_path, original[:len(original) // 2], "cut.db")
    for argv in commands(bad, tmp_path):
        result = subprocess.run([sys.executable, "-m", "ddptop", *argv], capture_output=True, text=True, timeout=60)
        assert result.returncode == 6 and "Traceback" not in result.stderr, result.stderr
        assert result.stderr.strip().splitlines()[-1].startswith(f"ddptop: {bad} is truncated")


def small_recording(tmp_path) -> str:
    path = str(tmp_path / "small.db")
    writer = RecordingWriter(path, base_meta({}, {"source": "local", "world_size": 1}))
    writer.handle([StepDone(0, s, 0, 0, 1.0 + s, 0.1, 0, 0.1, 0, 0, 0, 8, 1.0, 0, 0, 0, False) for s in range(3)])
    writer.close()
    return path


@pytest.mark.parametrize("bug", [TypeError("unsupported operand"), KeyError("segment"),
                                 AttributeError("'NoneType' object has no attribute 'step'"), IndexError("list index")])
def test_a_bug_while_reading_is_not_called_damage(tmp_path, bug):
    """What a consumer of a sound file raises is ddptop's own bug: it reaches cli.main's internal-error path
    (exit 70, DDPTOP_DEBUG=1 shows where), never "the file is damaged"."""
    with pytest.raises(type(bug)):
        with reading(small_recording(tmp_path)):
            raise bug


def test_what_damage_raises_while_reading_is_still_damage(tmp_path):
    with pytest.raises(RecordingError, match="is damaged: Expecting property name"):
        with reading(small_recording(tmp_path)):
            json.loads("{not json")
