"""Network namespaces, veth pairs, a bridge and tbf qdiscs through iproute2 (`ip`, `tc`); nothing else is touched."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

from ddptop.errors import LabUnavailable

NETNS_DIR = "/run/netns"  # where `ip netns add` pins named namespaces


class CommandFailed(Exception):
    def __init__(self, argv: list[str], stderr: str):
        self.argv, self.stderr = argv, stderr.strip()
        super().__init__(f"`{' '.join(argv)}`: {self.stderr.splitlines()[0] if self.stderr else 'failed'}")


def run(*argv: str) -> str:
    """Run a command; CommandFailed with its first stderr line when it fails."""
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, timeout=30)
    except FileNotFoundError:
        raise LabUnavailable(f"ddptop lab needs the `{argv[0]}` command (iproute2), which is not installed") from None
    except subprocess.TimeoutExpired:
        raise CommandFailed(list(argv), "timed out after 30 s") from None
    if done.returncode != 0:
        raise CommandFailed(list(argv), done.stderr)
    return done.stdout


def missing_tools() -> str:
    """'' when `ip` and `tc` are there, else what is missing."""
    absent = [tool for tool in ("ip", "tc") if shutil.which(tool) is None]
    if not absent:
        return ""
    return f"ddptop lab needs iproute2's {' and '.join(absent)} command{'s' if len(absent) > 1 else ''}"


def add_namespace(name: str) -> None:
    run("ip", "netns", "add", name)
    run("ip", "-n", name, "link", "set", "lo", "up")


def delete_namespace(name: str) -> None:
    """Unpin a namespace; it (with its veths, bridge and qdiscs) goes when no process is left in it."""
    if os.path.exists(os.path.join(NETNS_DIR, name)):
        subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=30)


def namespace_exists(name: str) -> bool:
    return os.path.exists(os.path.join(NETNS_DIR, name))


def namespace_inode(name: str) -> int | None:
    """The namespace's identity: a process whose /proc/PID/ns/net has this inode is inside it."""
    try:
        return os.stat(os.path.join(NETNS_DIR, name)).st_ino
    except OSError:
        return None


def namespace_pids(name: str) -> list[int]:
    if not namespace_exists(name):
        return []
    done = subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True, timeout=30)
    return [int(p) for p in done.stdout.split() if p.isdigit()]


def add_bridge(ns: str, bridge: str) -> None:
    run("ip", "-n", ns, "link", "add", bridge, "type", "bridge")
    run("ip", "-n", ns, "link", "set", bridge, "up")


def add_host_link(host_ns: str, switch_ns: str, port: str, bridge: str, address: str) -> None:
    """A veth pair made directly inside the two namespaces: `eth0` at the host, `port` on the bridge."""
    run("ip", "link", "add", "eth0", "netns", host_ns, "type", "veth", "peer", "name", port, "netns", switch_ns)
    run("ip", "-n", host_ns, "addr", "add", address, "dev", "eth0")
    run("ip", "-n", host_ns, "link", "set", "eth0", "up")
    run("ip", "-n", switch_ns, "link", "set", port, "master", bridge)
    run("ip", "-n", switch_ns, "link", "set", port, "up")


def shape(ns: str, dev: str, tbf_args: list[str]) -> None:
    run("tc", "-n", ns, "qdisc", "replace", "dev", dev, "root", *tbf_args)


def qdiscs(ns: str, dev: str) -> str:
    return run("tc", "-n", ns, "qdisc", "show", "dev", dev)


def counters(ns: str, dev: str = "eth0") -> tuple[int, int]:
    """(tx_bytes, rx_bytes) the kernel counted on `dev` inside `ns`."""
    data = json.loads(run("ip", "-n", ns, "-s", "-j", "link", "show", "dev", dev))
    stats = data[0]["stats64"]
    return int(stats["tx"]["bytes"]), int(stats["rx"]["bytes"])


def exec_argv(ns: str, argv: list[str]) -> list[str]:
    """`ip netns exec` also mounts the namespace's own /sys, so /sys/class/net shows that host's eth0."""
    return ["ip", "netns", "exec", ns, *argv]
