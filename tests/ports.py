"""Ports for the tests' jobs that nothing else can take between the handing out and the job's bind.

Binding port 0 and closing it (the old `free_port`) hands out an ephemeral port: under `-n 2` the other worker, or
any outgoing connection on the machine (a connect() picks its local port from the same range), may take it before
the job binds it. Here a port is:
- outside the kernel's ephemeral range (/proc/sys/net/ipv4/ip_local_port_range): no connect() is ever given it;
- in a region of its own for each xdist worker (PYTEST_XDIST_WORKER gw0, gw1, ...; a run without xdist has its own);
- in a block of BLOCK ports that this process holds an flock on for its life (another pytest run on the machine, or
  another process of this one, skips a held block; the kernel drops the lock when the process ends);
- checked bindable on every address (0.0.0.0, no SO_REUSEADDR) before it is handed out, and never handed out twice
  by one process.
A job binds one fixed port (its TCPStore at --port; the channel, gloo and torchrun's agent take ephemeral ones:
control/channel.py, front/supervisor.py), so `port()` gives one; `ports(n)` gives n consecutive ones for a test that
needs a run of them.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import tempfile
import threading

BLOCK = 32  # ports per flocked block
LOCKS = os.path.join(tempfile.gettempdir(), "ddptop-test-ports")


def ephemeral_range(path: str = "/proc/sys/net/ipv4/ip_local_port_range") -> tuple[int, int]:
    """The kernel's range for the local ports of outgoing connections (and of bind(port 0)), both ends included."""
    try:
        with open(path) as f:
            low, high = (int(x) for x in f.read().split())
        return low, high
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


def usable_range(ephemeral: tuple[int, int]) -> tuple[int, int]:
    """The widest run of unprivileged ports outside `ephemeral` (both ends included), capped at 16384 ports and kept
    against the ephemeral range's edge (the ports far below it are more often some service's)."""
    low, high = ephemeral
    below = (max(1024, low - 16384), low - 1)
    above = (high + 1, min(65535, high + 16384))
    best = max(below, above, key=lambda r: r[1] - r[0])
    if best[1] - best[0] + 1 < 4 * BLOCK:
        raise RuntimeError(f"tests/ports.py: no room for test ports outside the ephemeral range {low}-{high} "
                           "(/proc/sys/net/ipv4/ip_local_port_range)")
    return best


def worker_slot(env: dict | os._Environ = os.environ) -> tuple[int, int]:
    """(this process's region, how many regions): 0 outside xdist, 1 + N for worker gwN."""
    worker = env.get("PYTEST_XDIST_WORKER", "")
    count = int(env.get("PYTEST_XDIST_WORKER_COUNT", "0") or 0)
    if not worker.startswith("gw") or not worker[2:].isdigit():
        return 0, max(count, 2) + 1
    index = int(worker[2:])
    return index + 1, max(count, index + 1, 2) + 1


def bindable(port: int) -> bool:
    """Nothing is bound to `port` on any IPv4 address, nor in TIME_WAIT on it (no SO_REUSEADDR here)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


class Allocator:
    """Hands out ports from region `slot` of `slots` equal regions of `span` (first, last ports)."""

    def __init__(self, span: tuple[int, int], slot: int, slots: int, lock_dir: str = LOCKS):
        size = (span[1] - span[0] + 1) // slots // BLOCK * BLOCK
        if size < BLOCK:
            raise RuntimeError(f"tests/ports.py: {slots} regions do not fit in ports {span[0]}-{span[1]}")
        self.first, self.last = span[0] + slot * size, span[0] + (slot + 1) * size - 1
        self.lock_dir = lock_dir
        self._held: list[int] = []  # lock files' descriptors: held for the process's life
        self._cursor = self.first  # the next block to try
        self._next = self._end = 0  # the current block: the next port to try, one past its last
        self.pid = os.getpid()
        self._lock = threading.Lock()

    def ports(self, n: int = 1) -> int:
        """The first of `n` consecutive ports, each bindable now and never given before by this allocator."""
        with self._lock:
            while True:
                if self._end - self._next < n:
                    self._take_block(n)
                start = self._next
                run = range(start, start + n)
                self._next += 1
                if all(bindable(p) for p in run):  # blocks are taken in order and never again: none given twice
                    self._next = start + n
                    return start

    def _take_block(self, n: int) -> None:
        """The next block of this region that no other process holds: its lock file flocked and kept open."""
        if n > BLOCK:
            raise ValueError(f"at most {BLOCK} consecutive ports, asked for {n}")
        if not os.path.isdir(self.lock_dir):
            os.makedirs(self.lock_dir, exist_ok=True)
            with contextlib.suppress(OSError):  # shared by every user's runs, like /tmp itself
                os.chmod(self.lock_dir, 0o1777)
        while self._cursor + BLOCK - 1 <= self.last:
            base, self._cursor = self._cursor, self._cursor + BLOCK
            try:
                fd = os.open(os.path.join(self.lock_dir, f"{base}.lock"), os.O_RDONLY | os.O_CREAT, 0o644)
            except OSError:  # another user's file that we may not open: their block
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:  # held by another process
                os.close(fd)
                continue
            self._held.append(fd)
            self._next, self._end = base, base + BLOCK
            return
        raise RuntimeError(f"tests/ports.py: every block of ports {self.first}-{self.last} is held or used")


_default: Allocator | None = None


def _allocator() -> Allocator:
    global _default
    if _default is None or _default.pid != os.getpid():  # a forked child takes blocks of its own
        slot, slots = worker_slot()
        _default = Allocator(usable_range(ephemeral_range()), slot, slots, LOCKS)
    return _default


def port() -> int:
    """A port for a test's job (its --port, a TCPStore, an init_method): see the module's docstring."""
    return _allocator().ports(1)


def ports(n: int) -> int:
    """The first of `n` consecutive such ports."""
    return _allocator().ports(n)
