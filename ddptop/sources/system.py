"""Node and process readings from psutil: the job's interface, NIC rates and totals, CPU and memory."""

from __future__ import annotations

import ipaddress
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import psutil

from ddptop.errors import UsageError
from ddptop.events import LINK_BY, NIC_BY, NicStat, lab_cpus, link_bits
from ddptop.safe import read_text

# psutil's snetio fields, in the order NicStat wants them.
_FIELDS = ("bytes_recv", "bytes_sent", "packets_recv", "packets_sent", "errin", "errout", "dropin", "dropout")
_ZERO = (0,) * len(_FIELDS)
_DISCARD_PORT = 9  # a UDP connect() only picks a route and source address; nothing is sent


def job_interface(master_addr: str, iface: str | None = None) -> str:
    """The interface that carries traffic to `master_addr`: `iface` if given, else the routed one, else loopback."""
    addrs = psutil.net_if_addrs()
    if iface is not None:
        if iface not in addrs:
            have = ", ".join(sorted(addrs)) or "none"
            raise UsageError(f"no network interface {iface!r} on this host (it has: {have})")
        return iface
    loopback = loopback_interface(addrs)
    try:
        infos = socket.getaddrinfo(master_addr, _DISCARD_PORT, type=socket.SOCK_DGRAM)
    except (OSError, UnicodeError):
        return loopback
    local = {_bare(a.address): name for name, entries in addrs.items() for a in entries}
    for family, _, _, _, sockaddr in infos:
        master_ip = _bare(sockaddr[0])
        if _is_loopback(master_ip):
            return loopback
        if master_ip in local:
            # this host is the master: the other nodes' traffic arrives on the NIC holding that address
            return local[master_ip]
        source = _source_address(family, sockaddr)
        if source in local:
            return local[source]
    return loopback


def loopback_interface(addrs: Mapping[str, Any] | None = None) -> str:
    """This host's loopback interface name ("lo" on Linux, "lo0" on macOS)."""
    addrs = psutil.net_if_addrs() if addrs is None else addrs
    for name, entries in addrs.items():
        if any(_is_loopback(_bare(a.address)) for a in entries):
            return name
    return "lo"


def _source_address(family: int, sockaddr: tuple) -> str | None:
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.connect(sockaddr)
            return _bare(s.getsockname()[0])
    except OSError:  # no route to the master: the caller falls back to loopback
        return None


def _bare(address: str) -> str:
    return address.split("%", 1)[0]  # IPv6 link-local addresses carry "%iface"


def _is_loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:  # MAC addresses also appear in net_if_addrs
        return False


def _read_pernic() -> Mapping[str, Any]:
    return psutil.net_io_counters(pernic=True)


Speeds = Mapping[str, tuple[float, str]]  # interface → (bits/s each way, who says so)


def nic_speeds(job_iface: str | None = None) -> Speeds:
    """Each interface's known rate: the rate `ddptop lab` shaped the job's link to (the veth itself claims 10 Gbit/s),
    else the kernel's link speed where it reports one (psutil says 0 for unknown, e.g. loopback)."""
    speeds = {name: (stats.speed * 1e6, NIC_BY) for name, stats in psutil.net_if_stats().items() if stats.speed > 0}
    shaped = link_bits()
    if shaped is not None and job_iface is not None:
        speeds[job_iface] = (shaped, LINK_BY)
    return speeds


@dataclass
class _Nic:
    last: tuple[int, ...] | None  # the previous raw reading; None while the interface is absent
    totals: list[int] = field(default_factory=lambda: [0] * len(_FIELDS))
    peak_rx: float = 0.0
    peak_tx: float = 0.0


class NicTracker:
    """Per-interface rates, totals and peaks since construction, from cumulative kernel counters.

    A counter that goes backwards (reset, re-created interface, wrap) or an interface that was absent
    contributes 0 for that interval and becomes the new base: no negative or huge numbers ever come out.
    """

    def __init__(
        self,
        read_counters: Callable[[], Mapping[str, Any]] = _read_pernic,
        clock: Callable[[], float] = time.monotonic,
        speeds: Callable[[], Speeds] = nic_speeds,
    ) -> None:
        self._read = read_counters
        self._clock = clock
        self._speeds = speeds
        self._nics = {name: _Nic(_raw(c)) for name, c in read_counters().items()}
        self._t = clock()

    def sample(self) -> tuple[NicStat, ...]:
        counters = self._read()
        now = self._clock()
        dt, self._t = now - self._t, now
        for name in self._nics.keys() - counters.keys():
            self._nics[name].last = None
        speeds = self._speeds()
        return tuple(self._advance(name, _raw(counters[name]), dt, speeds.get(name)) for name in sorted(counters))

    def _advance(self, name: str, raw: tuple[int, ...], dt: float, speed: tuple[float, str] | None) -> NicStat:
        nic = self._nics.setdefault(name, _Nic(None))
        delta = _ZERO if nic.last is None else tuple(new - old for new, old in zip(raw, nic.last))
        if min(delta) < 0:
            delta = _ZERO
        nic.last = raw
        nic.totals = [t + d for t, d in zip(nic.totals, delta)]
        rx_rate = delta[0] / dt if dt > 0 else 0.0
        tx_rate = delta[1] / dt if dt > 0 else 0.0
        nic.peak_rx, nic.peak_tx = max(nic.peak_rx, rx_rate), max(nic.peak_tx, tx_rate)
        rx, tx, rx_p, tx_p, rx_e, tx_e, rx_d, tx_d = nic.totals
        bits, by = speed or (None, "")
        return NicStat(name, rx_rate, tx_rate, rx, tx, rx_p, tx_p, rx_e, tx_e, rx_d, tx_d, nic.peak_rx, nic.peak_tx,
                       bits, by)


def _raw(counters: Any) -> tuple[int, ...]:
    return tuple(int(getattr(counters, f)) for f in _FIELDS)


@dataclass(frozen=True)
class CpuMem:
    proc_cpu_percent: float  # summed over cores, like top: 250.0 = two and a half cores busy
    node_cpu_percent: float
    proc_rss_bytes: int
    node_mem_used_bytes: int
    node_mem_total_bytes: int
    node_cpu_quota: float | None = None  # cores: node_cpu_percent is the quota cgroup's share of it


@dataclass(frozen=True)
class QuotaCgroup:
    """The CPU quota cgroup this process runs in (a `ddptop lab` node is one) and where its CPU time is counted."""

    cores: float
    usage_s: Callable[[], float]  # CPU seconds the cgroup has used, a counter that only grows while it lives


def quota_cgroup(proc: str = "/proc") -> QuotaCgroup | None:
    """This process's CPU quota cgroup (from /proc/self/cgroup), or None: no quota, the node is the whole machine.

    The quota: v2 cpu.max, v1 cpu.cfs_quota_us / cpu.cfs_period_us. The CPU time: v2 cpu.stat usage_usec, v1
    cpuacct.usage where cpuacct shares the cgroup. A lab node runs under `ip netns exec`, which mounts a fresh /sys
    without the cgroup file systems: there the quota is the one the lab hands its jobs (CPUS_ENV) and the CPU time
    the sum over the processes in the same cgroup, found through /proc (`_Members`: one that leaves keeps its time)."""
    line = _own_cgroup(f"{proc}/self/cgroup")
    if line is None:
        return None
    version, path = line
    root = _mount(proc, version)
    folder = root + path if root else ""
    members = _Members(proc, line)
    if version == 2 and folder:
        limit = read_text(f"{folder}/cpu.max").split()
        if len(limit) != 2 or limit[0] == "max":
            return None
        usage = lambda: float(_stat(f"{folder}/cpu.stat").get("usage_usec", "nan")) / 1e6  # noqa: E731
        return QuotaCgroup(int(limit[0]) / int(limit[1]), usage if _stat(f"{folder}/cpu.stat") else members)
    if folder:
        quota, period = _number(f"{folder}/cpu.cfs_quota_us"), _number(f"{folder}/cpu.cfs_period_us")
        if quota is None or quota <= 0 or not period:
            return None  # -1: no quota
        acct = f"{folder}/cpuacct.usage"  # cpu and cpuacct mounted together
        return QuotaCgroup(quota / period, (lambda: _number(acct) / 1e9) if _number(acct) is not None else members)
    cores = lab_cpus()
    return None if cores is None else QuotaCgroup(cores, members)


def _own_cgroup(cgroup_file: str) -> tuple[int, str] | None:
    """(1, path) of v1's cpu controller, else (2, path) of the v2 tree; None in the root cgroup."""
    found = None
    for entry in read_text(cgroup_file).splitlines():
        _, controllers, path = entry.split(":", 2)
        if "cpu" in controllers.split(","):
            found = (1, path)
        elif controllers == "" and found is None:
            found = (2, path)
    return None if found is None or found[1] in ("/", "") else found


def _mount(proc: str, version: int) -> str:
    for entry in read_text(f"{proc}/self/mounts").splitlines():
        parts = entry.split()
        if len(parts) >= 4 and (parts[2] == "cgroup2" if version == 2 else
                                parts[2] == "cgroup" and "cpu" in parts[3].split(",")):
            return parts[1]
    return ""


class _Members:
    """CPU seconds of the processes in one cgroup, a counter that only grows while they come and go.

    The sum of each member's own and reaped children's CPU time: a worker reaped by a member moves its time into that
    member's children's, so the sum stays whole. One that left unreaped by a member (its parent elsewhere, or gone
    too) keeps the time last seen of it. Summing bare own times instead fell each time a DataLoader worker ended, and
    the node read 0% while busy (issue 44)."""

    def __init__(self, proc: str, line: tuple[int, str]) -> None:
        self._proc, self._line = proc, line
        self._last: dict[tuple[int, float], tuple[float, int]] = {}  # (pid, start) → (CPU seconds, parent pid)
        self._kept = 0.0  # the time of members gone without a member to reap them

    def __call__(self) -> float:
        now = self._read()
        alive = {pid for pid, _ in now}
        self._kept += sum(seconds for key, (seconds, parent) in self._last.items()
                          if key not in now and parent not in alive)
        self._last = now
        return self._kept + sum(seconds for seconds, _ in now.values())

    def _read(self) -> dict[tuple[int, float], tuple[float, int]]:
        found = {}
        for pid in psutil.pids():
            if _own_cgroup(f"{self._proc}/{pid}/cgroup") != self._line:
                continue
            try:
                process = psutil.Process(pid)
                with process.oneshot():
                    t, start, parent = process.cpu_times(), process.create_time(), process.ppid()
            except psutil.Error:  # gone since the list was read
                continue
            found[(pid, start)] = (t.user + t.system + t.children_user + t.children_system, parent)
        return found


def _stat(path: str) -> dict[str, str]:
    return dict(entry.split() for entry in read_text(path).splitlines() if len(entry.split()) == 2)



def _number(path: str) -> float | None:
    try:
        return float(read_text(path).strip())
    except ValueError:
        return None


class CpuMemReader:
    """CPU and memory of this process and node; each CPU percentage covers the time since the previous read."""

    def __init__(self, process: psutil.Process | None = None) -> None:
        self._proc = process or psutil.Process()
        self._primed_thread: int | None = None
        self._cgroup = quota_cgroup()
        self._used: tuple[float, float] = (0.0, 0.0)  # (monotonic time, cgroup CPU seconds) at the last read
        self.prime()

    def prime(self) -> None:
        """Start the CPU intervals now (the first psutil reading of an interval is meaningless)."""
        self._proc.cpu_percent(None)
        psutil.cpu_percent(None)
        if self._cgroup is not None:
            self._used = (time.monotonic(), self._cgroup.usage_s())
        self._primed_thread = threading.get_ident()

    def read(self) -> CpuMem:
        if self._primed_thread != threading.get_ident():
            self.prime()  # psutil keeps the node CPU baseline per thread: a new thread's first reading is 0
        with self._proc.oneshot():
            proc_cpu = self._proc.cpu_percent(None)
            rss = self._proc.memory_info().rss
        node_cpu = psutil.cpu_percent(None) if self._cgroup is None else self._quota_share(self._cgroup)
        vm = psutil.virtual_memory()
        # total - available counts what cannot be reclaimed; psutil's `used` differs by platform
        return CpuMem(proc_cpu, node_cpu, rss, vm.total - vm.available, vm.total,
                      None if self._cgroup is None else self._cgroup.cores)

    def _quota_share(self, cgroup: QuotaCgroup) -> float:
        """The cgroup's CPU time since the last read over what its quota allowed (a lab node's own CPU; psutil's
        node CPU is the whole machine, the same on every node). The counter only grows (`_Members`); 0 if not."""
        (t0, used0), now, used = self._used, time.monotonic(), cgroup.usage_s()
        self._used = (now, used)
        return max(0.0, 100.0 * (used - used0) / ((now - t0) * cgroup.cores)) if now > t0 else 0.0
