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
