"""`Lab`: N hosts as network namespaces on a bridge, each link shaped both ways, each host under a CPU quota.

    with Lab(nodes=3, link=parse_link("100mbit"), cpus=0.5) as lab:
        lab.popen(1, ["python", "-m", "ddptop", "--master", lab.addresses[0], "--rank", "1", ...])

Host i sees its link as `eth0` with address 192.0.2.<i+1> (TEST-NET-1 by default); the bridge lives in a
namespace of its own, so labs never meet each other or this machine's own interfaces and routes. The link is
shaped by tbf on the host's eth0 (what it sends) and on the bridge port towards it (what it receives): a
full-duplex link of the given rate, like a switched cluster NIC.
"""

from __future__ import annotations

import ctypes
import ipaddress
import math
import os
import secrets
import signal
import subprocess
import time

from ddptop.errors import LabUnavailable, UsageError
from ddptop.lab import cgroups, netns, state
from ddptop.lab.links import Link

DEFAULT_SUBNET = "192.0.2.0/24"
PR_SET_PDEATHSIG = 1
CLONE_NEWUTS = 0x04000000
_LIBC = ctypes.CDLL(None, use_errno=True)


def machine_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def host_addresses(subnet: str, nodes: int) -> tuple[list[str], int]:
    """The first `nodes` host addresses of `subnet` and its prefix length; UsageError if it is too small."""
    try:
        net = ipaddress.IPv4Network(subnet, strict=True)
    except ValueError as exc:
        raise UsageError(f"--subnet: {exc}") from None
    hosts = [str(a) for _, a in zip(range(nodes), net.hosts())]
    if len(hosts) < nodes:
        raise UsageError(f"--subnet {subnet} has room for {len(hosts)} hosts, not {nodes}")
    return hosts, net.prefixlen


# Plain `sudo ddptop lab` finds no ddptop where it was installed into a venv (sudo's secure_path has no .venv/bin),
# and drops the environment: -E keeps it (DDPTOP_* included), env "PATH=$PATH" keeps the user's PATH, so the same
# ddptop runs as root. The $PATH is the user's shell's to expand.
NEEDS_ROOT = ('ddptop lab needs root (network namespaces, tc and cgroups): run it as root with this ddptop and '
              'environment: sudo -E env "PATH=$PATH" ddptop lab ...')

class Lab:
    """Build with `with Lab(...) as lab` (or build()/teardown()); everything it made goes at teardown."""

    def __init__(self, nodes: int, link: Link, cpus: float | None, subnet: str = DEFAULT_SUBNET):
        if nodes < 1:
            raise UsageError(f"--nodes must be at least 1, got {nodes}")
        if cpus is not None and not 0.01 <= cpus <= machine_cores():
            raise UsageError(f"--cpus-per-node must be between 0.01 and this machine's {machine_cores()} cores, "
                             f"got {cpus:g}")
        self.nodes, self.link, self.cpus = nodes, link, cpus
        self.addresses, self.prefix = host_addresses(subnet, nodes)
        self.tag = secrets.token_hex(3)
        base = f"{state.PREFIX}-{self.tag}"
        self.names = [f"{base}-n{i}" for i in range(nodes)]
        self.switch = f"{base}-sw"
        self.controller: cgroups.CpuController | None = None
        self.cgroups: list[str | None] = [None] * nodes
        self.record = state.LabRecord(self.tag, os.getpid(), state.process_start(os.getpid()), time.time(),
                                      nodes, link.describe(), "unlimited" if cpus is None else f"{round(cpus, 2):g}")

    @property
    def threads(self) -> int:
        """Torch threads per rank: the quota rounded up (0.5 CPU → 1 thread), or the cores shared out."""
        if self.cpus is None:
            return max(1, machine_cores() // self.nodes)
        return max(1, math.ceil(self.cpus - 1e-9))

    @property
    def folder(self) -> str:
        return self.record.folder

    def __enter__(self) -> "Lab":
        self.build()
        return self

    def __exit__(self, *exc) -> None:
        self.teardown()

    def preflight(self) -> None:
        """One line saying what is missing when this machine cannot host a lab (LabUnavailable, exit 2)."""
        if os.geteuid() != 0:
            raise LabUnavailable(NEEDS_ROOT)
        missing = netns.missing_tools()
        if missing:
            raise LabUnavailable(missing)
        if self.cpus is not None:
            found = cgroups.find_controller()
            if isinstance(found, str):
                raise LabUnavailable(f"{found}; run with --cpus-per-node unlimited to skip CPU quotas")
            self.controller = found

    def build(self) -> None:
        self.preflight()
        state.remove_dead_labs()
        try:
            self._note()  # the record first: whatever follows is found again if this process dies
            os.makedirs(self.folder, mode=0o700, exist_ok=True)
            self._build()
        except netns.CommandFailed as exc:
            self.teardown()
            raise LabUnavailable(f"cannot build the lab: {exc}") from None
        except BaseException:
            self.teardown()
            raise

    def _build(self) -> None:
        self._note(namespaces=[self.switch])
        netns.add_namespace(self.switch)
        netns.add_bridge(self.switch, "br0")
        for i, ns in enumerate(self.names):
            self._note(namespaces=[ns])
            netns.add_namespace(ns)
            port = self.port(i)
            netns.add_host_link(ns, self.switch, port, "br0", f"{self.addresses[i]}/{self.prefix}")
            if self.link.bits_per_s is not None:
                netns.shape(ns, "eth0", self.link.tbf())  # what host i sends
                netns.shape(self.switch, port, self.link.tbf())  # what host i receives
        if self.controller is not None and self.cpus is not None:
            for i, ns in enumerate(self.names):
                self._note(groups=[self.controller.path(ns)])
                self.cgroups[i] = self.controller.create(ns, self.cpus)

    def _note(self, namespaces: list[str] = (), groups: list[str] = ()) -> None:
        """Written down before it exists: a lab killed between the two is still found and removed."""
        self.record.namespaces += namespaces
        self.record.cgroups += groups
        self.record.save()

    def port(self, node: int) -> str:
        return f"p{self.tag}n{node}"

    def teardown(self) -> list[str]:
        """Stop what runs inside, remove every namespace and cgroup of this lab; what is left (normally nothing)."""
        return state.remove_lab(self.record, self.controller)

    def command(self, node: int, argv: list[str]) -> list[str]:
        return netns.exec_argv(self.names[node], argv)

    def popen(self, node: int, argv: list[str], quota: bool = True, session: bool = False,
              group: bool = False, **kwargs) -> subprocess.Popen:
        """Start `argv` on host `node` (inside its CPU quota unless quota=False); it dies with this process."""
        procs = os.path.join(self.cgroups[node], "cgroup.procs") if quota and self.cgroups[node] else None
        setup = _in_child(self.hostname(node), procs, session, group)
        return subprocess.Popen(self.command(node, argv), preexec_fn=setup, **kwargs)

    @staticmethod
    def hostname(node: int) -> str:
        """Each host has its own name, as on a cluster: ddptop tells nodes apart by it (Network panel, recordings)."""
        return f"node{node}"

    def join_quota(self, node: int, pid: int) -> bool:
        """Put a process that host `node` started (rank 0 under node 0's front) into that host's quota."""
        return self.cgroups[node] is None or cgroups.add_process(self.cgroups[node], pid)

    def counters(self, node: int) -> tuple[int, int]:
        """(tx, rx) bytes the kernel counted on host `node`'s eth0."""
        return netns.counters(self.names[node], "eth0")

    def describe(self) -> str:
        how = f" ({self.controller.describe()})" if self.controller else ""
        cpus = "no CPU quota" if self.cpus is None else f"{round(self.cpus, 2):g} CPU each{how}"
        return (f"{self.nodes} node{'s' if self.nodes > 1 else ''} {self.addresses[0]}"
                f"{'..' + self.addresses[-1] if self.nodes > 1 else ''} on a switch, links {self.link.describe()} "
                f"each way, {cpus}, {self.threads} thread{'s' if self.threads > 1 else ''} per rank")


def _in_child(hostname: str, procs: str | None, session: bool, group: bool):
    """Runs between fork and exec: the host's name, own session or process group, death with the lab, the quota."""
    name = hostname.encode()

    def setup() -> None:
        if _LIBC.unshare(CLONE_NEWUTS) == 0:  # a UTS namespace of its own, so the name stays with this process
            _LIBC.sethostname(name, len(name))
        if session:
            os.setsid()
        elif group:  # node 0's front, on the user's terminal: Ctrl-Z would stop it behind the lab's back
            os.setpgid(0, 0)
            signal.signal(signal.SIGTSTP, signal.SIG_IGN)
        _LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        if procs is not None:
            with open(procs, "w") as f:
                f.write(str(os.getpid()))

    return setup
