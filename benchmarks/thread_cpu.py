"""ddptop's CPU per training step, thread by thread, as the kernel counts it (issue 42).

Starts `ddptop run --local 1 --strategy single` (the tiny model at batch 2, one thread, recorded), waits for
`--after` recorded steps, reads every thread's user + system ticks from /proc/PID/task/TID/stat of the front and
the rank, again `--window` seconds later, and divides each thread's difference by the steps recorded in between.
Threads are named by py-spy (`py-spy dump`: ddptop-publish-0, ddptop-hub, …) where it is installed, else by the
kernel's name; the rank's main thread is "training", whose share inside ddptop's code is `own_s` (the recording's
mean over the same steps, as are `threads_s` and the step time). A thread's CPU time is counted by the kernel as it
runs, so a loaded machine distorts it far less than wall time (it does lengthen steps, and with them the per-step
share of work done per second: the table gives step ms too). `--root` runs another checkout's ddptop (A/B).

    .venv/bin/python benchmarks/thread_cpu.py [--probes off] [--window 25] [--after 300] [--root PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HZ = os.sysconf("SC_CLK_TCK")


def tree(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            kids = [int(x) for x in f.read().split()]
    except OSError:
        kids = []
    return [pid] + [p for kid in kids for p in tree(kid)]


def ticks(pid: int) -> dict[int, tuple[str, int]]:
    """Each thread of `pid`: (its kernel name, user + system ticks)."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                comm = f.read().strip()
        except OSError:  # ended meanwhile
            continue
        out[int(tid)] = (comm, int(fields[11]) + int(fields[12]))
    return out


def names(pid: int) -> dict[int, str]:
    """Python thread names by native id, from py-spy (absent: {})."""
    spy = shutil.which("py-spy") or os.path.join(os.path.dirname(sys.executable), "py-spy")
    if not os.path.exists(spy):
        return {}
    try:
        dump = subprocess.run([spy, "dump", "--nonblocking", "--json", "-p", str(pid)], capture_output=True,
                              text=True, timeout=30).stdout
        return {t.get("os_thread_id"): t.get("thread_name") for t in json.loads(dump)}
    except (subprocess.SubprocessError, ValueError):
        return {}


def query(db: str, sql: str, *args) -> tuple:
    try:
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=1)
        try:
            return con.execute(sql, args).fetchone()
        finally:
            con.close()
    except sqlite3.Error:  # not created yet
        return (None,) * 3


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--probes", default="off")
    ap.add_argument("--window", type=float, default=25.0, help="seconds between the two readings")
    ap.add_argument("--after", type=int, default=300, help="recorded steps before the first reading")
    ap.add_argument("--steps", type=int, default=20000, help="the run's length (it is stopped after the window)")
    ap.add_argument("--root", default=ROOT, help="the checkout whose ddptop runs")
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="ddptop-threads-")
    db = os.path.join(tmp, "run.db")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONPATH": args.root}
    cmd = [sys.executable, "-m", "ddptop", "run", "--local", "1", "--strategy", "single", "--model", "tiny",
           "--batch-size", "2", "--steps", str(args.steps), "--synthetic-size", str(2 * (args.steps + 10)), "--lr",
           "0.01", "--threads", "1", "--no-eval", "--headless", "--log-every", "1000000", "--probes", args.probes,
           "--record", db]
    front = subprocess.Popen(cmd, cwd=args.root, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        while (query(db, "SELECT max(step) FROM steps")[0] or 0) < args.after:
            if front.poll() is not None:
                raise SystemExit(f"the run ended before {args.after} steps: {front.stderr.read()[-400:]}")
            time.sleep(0.2)
        procs = tree(front.pid)
        rank = procs[-1]
        label = {(p, tid): name for p in procs for tid, name in names(p).items()}
        first, step0 = {p: ticks(p) for p in procs}, query(db, "SELECT max(step) FROM steps")[0]
        time.sleep(args.window)
        last, step1 = {p: ticks(p) for p in procs}, query(db, "SELECT max(step) FROM steps")[0]
        deadline = time.monotonic() + 30  # every step of the window recorded (a sampled step's row can come later)
        while (query(db, "SELECT count(*) FROM steps WHERE step > ? AND step <= ?", step0, step1)[0] or 0) \
                < step1 - step0 and time.monotonic() < deadline:
            time.sleep(0.1)
        own, threads, step_s = query(db, "SELECT avg(own_s), avg(threads_s), avg(iter_s) FROM steps "
                                         "WHERE step > ? AND step <= ?", step0, step1)
    finally:
        front.terminate()
        front.wait(timeout=60)
    steps = step1 - step0
    rows: dict[str, float] = {}
    for p in procs:
        who = "rank" if p == rank else "front" if p == front.pid else f"process {p}"
        for tid, (comm, t1) in last.get(p, {}).items():
            name = "training" if (p, tid) == (rank, rank) else label.get((p, tid)) or comm
            spent = t1 - first.get(p, {}).get(tid, (comm, 0))[1]
            rows[f"{who}: {name}"] = rows.get(f"{who}: {name}", 0.0) + spent / HZ / steps
    print(f"--probes {args.probes}: {steps} steps in {args.window:g} s, step {step_s * 1e3:.2f} ms; own_s "
          f"{own * 1e3:.3f} ms, threads_s {threads * 1e3:.3f} ms (the recording's means)")
    print("| thread | CPU ms/step |")
    print("|---|---|")
    for key, value in sorted(rows.items()):
        if value:
            print(f"| {key} | {value * 1e3:.3f} |")
    print(f"| front, all threads | {sum(v for k, v in rows.items() if k.startswith('front')) * 1e3:.3f} |")


if __name__ == "__main__":
    main()
