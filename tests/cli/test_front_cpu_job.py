"""A real job's front measures its own CPU per job step (issue 42): each FrontCost reading in the recording against
the front process's CPU read from /proc by this test while the job ran, and `ddptop info` says the SQL figure."""

from __future__ import annotations

import bisect
import csv
import json
import os
import signal
import subprocess
import sys
import time

from procs import recording_rows

TICK = os.sysconf("SC_CLK_TCK")
DDPTOP = [sys.executable, "-m", "ddptop"]
JOB = ["--headless", "--local", "1", "--model", "tiny", "--synthetic-size", "640", "--batch-size", "2", "--no-eval",
       "--backend", "gloo", "--strategy", "single", "--threads", "1", "--log-every", "500"]


def cpu_of(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / TICK


def front_rows(record) -> list[dict]:
    return [json.loads(data) for (data,) in
            recording_rows(record, "SELECT data FROM events WHERE kind = 'front_cost' ORDER BY seq")]


def at(polls: list[tuple[float, float]], t: float) -> float:
    """The front's CPU at wall time t, interpolated between the two polls around it."""
    times = [p[0] for p in polls]
    i = bisect.bisect_left(times, t)
    assert 0 < i < len(polls), "a reading outside the polled window"
    (t0, c0), (t1, c1) = polls[i - 1], polls[i]
    return c0 + (c1 - c0) * (t - t0) / (t1 - t0)


def test_the_fronts_cpu_per_step_is_what_proc_counted_over_the_steps_and_info_says_it(tmp_path):
    record = tmp_path / "run.db"
    proc = subprocess.Popen(DDPTOP + ["--steps", "1000000", "--record", str(record), *JOB], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    polls: list[tuple[float, float]] = []  # (wall time, the front process's CPU from /proc)
    deadline, stopped = time.monotonic() + 300, False
    while proc.poll() is None and time.monotonic() < deadline:
        cpu = cpu_of(proc.pid)
        if cpu is not None:
            polls.append((time.time(), cpu))
        if not stopped and len(polls) % 20 == 0 and len(front_rows(record)) >= 4:  # however fast the steps run
            os.killpg(proc.pid, signal.SIGINT)  # the terminal's Ctrl-C: the job stops and closes its recording
            stopped = True
        time.sleep(0.05)
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    out, err = proc.communicate(timeout=60)
    assert stopped and proc.returncode == 0, err[-3000:]

    readings = front_rows(record)
    last_step = recording_rows(record, "SELECT max(step) FROM steps")[0][0]
    assert len(readings) >= 3, (len(readings), out[-2000:])
    for before, r in zip(readings, readings[1:]):
        assert r["steps"] == r["step"] - before["step"] > 0  # consecutive: every job step counted once
    assert readings[-1]["step"] <= last_step
    # the CPU between the first and the last reading: what /proc counted over the same wall-clock window
    counted = at(polls, readings[-1]["t"]) - at(polls, readings[0]["t"])
    measured = sum(r["cpu_s"] for r in readings[1:])
    assert abs(measured - counted) <= 0.10 * counted + 3 / TICK, (measured, counted)

    steps = sum(r["steps"] for r in readings)
    per_step = sum(r["cpu_s"] for r in readings) / steps
    info = subprocess.run(DDPTOP + ["info", str(record)], capture_output=True, text=True, timeout=120)
    assert info.returncode == 0, info.stderr
    line = next(x for x in info.stdout.splitlines() if x.startswith("front "))
    assert f"{per_step * 1e3:.2f} ms CPU per job step over {steps} steps" in line, line
    data = json.loads(subprocess.run(DDPTOP + ["info", "--json", str(record)], capture_output=True, text=True,
                                     timeout=120).stdout)
    assert data["front"]["steps"] == steps and abs(data["front"]["cpu_s_per_step"] - per_step) <= 1e-12

    report = subprocess.run(DDPTOP + ["report", str(record), "-o", str(tmp_path / "rep")], capture_output=True,
                            text=True, timeout=300)
    assert report.returncode == 0, report.stderr
    rows = list(csv.DictReader(open(next((tmp_path / "rep").rglob("segments.csv")))))
    assert len(rows) == 1 and rows[0]["ddptop front CPU ms/step"] == f"{per_step * 1e3:.2f}", rows
