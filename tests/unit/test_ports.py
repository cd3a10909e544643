"""The tests' port allocator (tests/ports.py): ports outside the kernel's ephemeral range, disjoint between xdist
workers and between processes, each bindable when handed out, never handed out twice."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

import ports

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# a process that takes 100 ports (three blocks and more) as a test under xdist worker $PYTEST_XDIST_WORKER would,
# prints them, and holds its blocks until its stdin closes
TAKER = """
import sys
sys.path.insert(0, sys.argv[1])
import ports
ports.LOCKS = sys.argv[2]
print(" ".join(str(ports.port()) for _ in range(100)), flush=True)
sys.stdin.read()
"""


def taker(worker: str, lock_dir: str) -> subprocess.Popen:
    env = {**os.environ, "PYTEST_XDIST_WORKER": worker, "PYTEST_XDIST_WORKER_COUNT": "2"}
    if not worker:
        env.pop("PYTEST_XDIST_WORKER")
    return subprocess.Popen([sys.executable, "-c", TAKER, TESTS, lock_dir], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env=env)


def taken(proc: subprocess.Popen) -> set[int]:
    line = proc.stdout.readline()
    assert line, f"the taker exited {proc.wait()}"
    got = [int(p) for p in line.split()]
    assert len(set(got)) == len(got) == 100, got  # never twice in one process
    return set(got)


def test_workers_and_processes_get_disjoint_ports_outside_the_ephemeral_range(tmp_path):
    low, high = (int(x) for x in open("/proc/sys/net/ipv4/ip_local_port_range").read().split())
    # each worker its own lock folder: only the regions keep gw0 and gw1 apart here
    procs = {w: taker(w, str(tmp_path / (w or "none"))) for w in ("gw0", "gw1", "")}
    # a second process as gw0 beside the first (another pytest run on this machine), the same lock folder: the
    # blocks the first holds are skipped
    procs["gw0 again"] = taker("gw0", str(tmp_path / "gw0"))
    try:
        got = {w: taken(p) for w, p in procs.items()}
    finally:
        for p in procs.values():
            p.communicate("")
    names = list(got)
    for i, a in enumerate(names):
        assert all(1024 <= p <= 65535 and not low <= p <= high for p in got[a]), (a, sorted(got[a])[:5], low, high)
        for b in names[i + 1:]:
            assert got[a].isdisjoint(got[b]), (a, b, sorted(got[a] & got[b])[:5])


def test_a_port_something_holds_is_skipped_and_none_is_given_twice(tmp_path):
    # the suite's own lock files: blocks another test process holds (a job of theirs may listen in them) are skipped,
    # as in use (a CI run: another pytest's job held first + 1 in the same region, and the holder could not bind it)
    allocator = ports.Allocator(ports.usable_range(ports.ephemeral_range()), 0, 3, ports.LOCKS)
    first = allocator.ports()
    with socket.socket() as holder:  # another program listening on the next candidate
        try:
            holder.bind(("127.0.0.1", first + 1))
            holder.listen()
        except OSError:  # something else holds it already: as good a holder for this test
            pass
        second = allocator.ports()
        assert second > first + 1, (first, second)
    given = [first, second] + [allocator.ports() for _ in range(80)]
    assert len(set(given)) == len(given)
    run = allocator.ports(3)  # a run of three: none of them given before
    after = allocator.ports()
    assert {run, run + 1, run + 2}.isdisjoint(given + [after])
    for p in given:
        with socket.socket() as s:  # each was bindable (and still is: nothing here listens on them)
            s.bind(("0.0.0.0", p))
    for fd in allocator._held:  # its blocks back to the suite's other processes
        os.close(fd)


def test_the_range_is_the_side_of_the_ephemeral_range_with_room():
    assert ports.usable_range((32768, 60999)) == (16384, 32767)
    assert ports.usable_range((10000, 65000)) == (1024, 9999)
    assert ports.usable_range((1100, 40000)) == (40001, 56384)
    with pytest.raises(RuntimeError, match="no room"):
        ports.usable_range((1024, 65535))
