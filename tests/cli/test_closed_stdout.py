"""`ddptop --headless … | head -3` (issue 41): before, the run trained on to its end printing into a closed pipe
(47 'while showing the run: BrokenPipeError' failures) and then ended in exit 70, `internal error: BrokenPipeError`.
Now a reader that went away ends the run as it ends `yes | head`: exit 141 (128 + SIGPIPE), no traceback, the ranks
stopped cleanly (each says `stopped`) and the recording closed. A real pipe, read three lines and closed."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
STEPS = 1500  # far more than the run makes before the stop: one that trained to its end never took it


def test_a_closed_stdout_stops_the_job_cleanly_and_closes_the_recording(tmp_path):
    record = tmp_path / "run.db"
    proc = subprocess.Popen([sys.executable, "-m", "ddptop", "--headless", "--local", "2", "--model", "tiny",
                             "--steps", str(STEPS), "--log-every", "1", "--record", str(record)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
                            env={**os.environ, "PYTHONPATH": str(REPO), "DDPTOP_STATE_DIR": str(tmp_path / "jobs")})
    try:
        lines = [proc.stdout.readline() for _ in range(3)]
        proc.stdout.close()  # `head -3` exits
        err = proc.stderr.read()
        proc.wait(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert all(lines), lines
    assert proc.returncode == 141, (proc.returncode, err)
    assert "Traceback" not in err and "internal error" not in err and "BrokenPipeError" not in err, err
    with sqlite3.connect(record) as db:
        closed = db.execute("SELECT count(*) FROM meta WHERE key = 'closed'").fetchone()[0]
        finished = db.execute("SELECT json_extract(data, '$.rank'), json_extract(data, '$.reason'), "
                              "json_extract(data, '$.steps') FROM events WHERE kind = 'run_finished' "
                              "ORDER BY 1").fetchall()
    assert closed == 1, "the recording was not closed"
    assert [(rank, reason) for rank, reason, _ in finished] == [(0, "stopped"), (1, "stopped")], finished
    assert all(steps < STEPS for _, _, steps in finished), finished
