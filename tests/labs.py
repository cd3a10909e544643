"""Helpers for the lab tests: whether this machine can build labs, `ddptop lab` as a subprocess, what a lab left."""

from __future__ import annotations

import os
import re
import sqlite3
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Callable, Iterator

from ddptop.lab import cgroups, netns, state

REPO = Path(__file__).resolve().parents[1]


def netns_refused() -> str:
    """'' when this machine lets us make network namespaces and veths, else the reason it does not."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if netns.missing_tools():
        return netns.missing_tools()
    probe = f"ddplab-probe-{uuid.uuid4().hex[:6]}"
    try:
        netns.add_namespace(probe)
    except Exception as exc:  # noqa: BLE001 - any refusal is a reason to skip
        return f"network namespaces are refused here: {exc}"
    finally:
        netns.delete_namespace(probe)
    return ""


def cgroups_refused() -> str:
    found = cgroups.find_controller()
    if isinstance(found, str):
        return found
    probe = f"ddplab-probe-{uuid.uuid4().hex[:6]}"
    try:
        os.rmdir(found.create(probe, 0.5))
    except Exception as exc:  # noqa: BLE001
        return f"CPU quota cgroups are refused here: {exc}"
    return ""


NETNS_REFUSED = netns_refused()
LAB_REFUSED = NETNS_REFUSED or cgroups_refused()


class LabProcess:
    """`ddptop lab ARGS` with its output collected line by line (stdout and stderr together)."""

    def __init__(self, args: list[str], lab_dir: Path, **kwargs):
        env = {**os.environ, "PYTHONPATH": str(REPO), state.STATE_ENV: str(lab_dir)}
        self.lab_dir = lab_dir
        self.proc = subprocess.Popen([sys.executable, "-m", "ddptop", "lab", *args], env=env, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kwargs)
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def wait_line(self, pattern: str, timeout: float = 120) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            hit = next((line for line in self.lines if re.search(pattern, line)), None)
            if hit is not None:
                return hit
            if self.proc.poll() is not None and not self._reader.is_alive():
                break
            time.sleep(0.1)
        raise AssertionError(f"no line matching {pattern!r}:\n" + "\n".join(self.lines[-30:]))

    def wait(self, timeout: float = 180) -> int:
        try:
            code = self.proc.wait(timeout=timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
        self._reader.join(timeout=10)
        return code

    @property
    def output(self) -> str:
        return "\n".join(self.lines)

    def record(self, timeout: float = 60) -> state.LabRecord:
        """This lab's state file once every object is listed in it."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            mine = [r for r in state.records(str(self.lab_dir)) if r.owner_pid == self.proc.pid]
            if mine and len(mine[0].namespaces) == mine[0].nodes + 1 and len(mine[0].cgroups) == mine[0].nodes:
                return mine[0]
            time.sleep(0.05)
        raise AssertionError("the lab never wrote its state file:\n" + self.output)


def inodes(record: state.LabRecord) -> set[int]:
    """The lab's namespaces by identity: they live on while any process holds them, even once unnamed."""
    return {i for ns in record.namespaces if (i := netns.namespace_inode(ns)) is not None}


def leftovers(record: state.LabRecord, namespace_inodes: set[int], lab_dir: Path) -> list[str]:
    """Everything of this lab still on the machine: names, cgroups, files, and any process inside its namespaces."""
    left = [f"namespace {n}" for n in record.namespaces if netns.namespace_exists(n)]
    left += [f"cgroup {g}" for g in record.cgroups if os.path.exists(g)]
    left += [f"file {p}" for p in (lab_dir / f"{record.tag}.json", lab_dir / record.tag) if p.exists()]
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    left += [f"interface in this namespace: {line[:60]}" for line in links.splitlines() if record.tag in line]
    for pid in os.listdir("/proc"):
        try:
            if pid.isdigit() and os.stat(f"/proc/{pid}/ns/net").st_ino in namespace_inodes:
                left.append(f"process {pid} inside the lab's network")
        except OSError:
            pass
    return left


def watched(lab: LabProcess, watch_for: Callable[[state.LabRecord], threading.Thread], db: Path, timeout: float
            ) -> Iterator[tuple[sqlite3.Connection, threading.Thread]]:
    """A module fixture's body: the lab run to its end (exit 0) while the thread `watch_for(its record)` (one with a
    `done` event) reads its hosts' counters; yields (the recording, read-only; the watch), then asserts the lab
    left nothing behind."""
    record = lab.record()
    held = inodes(record)
    watch = watch_for(record)
    watch.start()
    try:
        code = lab.wait(timeout)
    finally:
        watch.done.set()
    print(lab.output)
    assert code == 0, lab.output
    yield sqlite3.connect(f"file:{db}?mode=ro", uri=True), watch
    assert leftovers(record, held, lab.lab_dir) == []


class NicWatch(threading.Thread):
    """Every host's eth0 byte counters as the kernel keeps them, read every 10 ms from /proc/PID/net/dev of a
    process inside each namespace (each process sees its own namespace's there): per host, (time, received, sent)."""

    def __init__(self, namespaces: list[str]):
        super().__init__(daemon=True)
        self.namespaces, self.done = namespaces, threading.Event()
        self.samples: list[list[tuple[float, int, int]]] = [[] for _ in namespaces]

    def run(self) -> None:
        while not self.done.is_set():
            for host, namespace in enumerate(self.namespaces):
                reading = _eth0(namespace)
                if reading is not None:
                    self.samples[host].append((time.time(), *reading))
            self.done.wait(0.01)

    def after(self, host: int, t: float) -> tuple[int, int]:
        """(received, sent) by `host` at its first reading at or after wall time t."""
        return min((s for s in self.samples[host] if s[0] >= t), key=lambda s: s[0])[1:]

    def within(self, host: int, start: float, end: float) -> tuple[int, int] | None:
        """(received, sent) by `host` at its last reading between wall times start and end (None: no reading)."""
        inside = [s for s in self.samples[host] if start <= s[0] <= end]
        return max(inside, key=lambda s: s[0])[1:] if inside else None


def _eth0(namespace: str) -> tuple[int, int] | None:
    for pid in netns.namespace_pids(namespace):
        try:
            with open(f"/proc/{pid}/net/dev") as fh:
                fields = next(x for x in fh if x.strip().startswith("eth0:")).split(":", 1)[1].split()
        except (OSError, StopIteration):
            continue
        return int(fields[0]), int(fields[8])
    return None
