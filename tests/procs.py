"""The rank processes a front started, found as a user's `ps` finds them: by name (ddptop-rank-N), at any depth
(several CPU ranks fork from a server the front started; one rank is the front's child)."""

from __future__ import annotations

import time

import psutil


def rank_processes(pid: int) -> list[psutil.Process]:
    """The ranks under process `pid` now. A child that ended between the listing and the look (a zombie until its
    parent reaps it: CI once met one) is not a rank that runs."""
    out = []
    try:
        children = psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    for child in children:
        try:
            if child.name().startswith("ddptop-rank-") and child.status() != psutil.STATUS_ZOMBIE:
                out.append(child)
        except psutil.NoSuchProcess:  # ZombieProcess too (its subclass)
            pass
    return out


def still_running(processes: list[psutil.Process], within_s: float) -> list[psutil.Process]:
    """Those of `processes` that still run (a zombie does not) after at most `within_s`: [] as soon as none does."""
    deadline = time.monotonic() + within_s
    while True:
        left = []
        for proc in processes:
            try:
                if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                    left.append(proc)
            except psutil.NoSuchProcess:
                pass
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.05)


def unique_memory(pid: int) -> int:
    """The process's unique memory (USS): Private_Clean + Private_Dirty of /proc/PID/smaps_rollup, as the kernel sums
    them (bytes), read by the test, not by ddptop."""
    with open(f"/proc/{pid}/smaps_rollup") as f:
        return 1024 * sum(int(line.split()[1]) for line in f if line.split(":")[0] in ("Private_Clean",
                                                                                       "Private_Dirty"))


def recording_rows(path, sql: str, args=()) -> list:
    """SQL on a recording a job is writing: [] while it is not created yet or being written."""
    import sqlite3

    try:
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
            return db.execute(sql, args).fetchall()
    except sqlite3.OperationalError:
        return []


def wait_while_running(what: str, check, proc, deadline_s: float = 180.0):
    """`check()`'s first true value, polled every 0.2 s while the job `proc` runs; its output in the failure."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        got = check()
        if got:
            return got
        assert proc.poll() is None, f"the job ended before {what}: {proc.communicate()[0][-3000:]}"
        time.sleep(0.2)
    raise AssertionError(f"no {what} within {deadline_s:.0f} s")
