"""A cluster of N hosts on one machine: network namespaces, veth pairs, a bridge; 192.0.2.0/24 (TEST-NET-1).

Each host sees its link as `eth0` with address 192.0.2.<i+1>, like a node of the CS744 cluster. Everything
is torn down on exit, even when the body fails. Also usable by hand:  python tests/netns_cluster.py 3
"""

from __future__ import annotations

import subprocess
import sys
import uuid


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


def namespaces_work() -> str:
    """'' when this machine lets us make namespaces, else the reason it does not."""
    probe = f"ddpt-probe-{uuid.uuid4().hex[:6]}"
    try:
        _ip("netns", "add", probe)
    except FileNotFoundError:
        return "the `ip` command (iproute2) is not installed"
    except subprocess.CalledProcessError as exc:
        return f"network namespaces are not permitted here: {exc.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return ""


class Cluster:
    """`with Cluster(3) as c: c.exec(i, [...])` — host i runs commands in its own namespace."""

    def __init__(self, hosts: int):
        self.hosts = hosts
        self.tag = uuid.uuid4().hex[:6]
        self.names = [f"ddpt-{self.tag}-{i}" for i in range(hosts)]
        self.switch = f"ddpt-{self.tag}-sw"
        self.addresses = [f"192.0.2.{i + 1}" for i in range(hosts)]

    def __enter__(self) -> "Cluster":
        try:
            self._build()
        except BaseException:
            self.teardown()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.teardown()

    def _build(self) -> None:
        _ip("netns", "add", self.switch)
        _ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.switch, "link", "set", "br0", "up")
        for i, ns in enumerate(self.names):
            _ip("netns", "add", ns)
            _ip("-n", ns, "link", "set", "lo", "up")
            host_end, switch_end = f"h{self.tag}{i}", f"p{self.tag}{i}"
            _ip("link", "add", host_end, "type", "veth", "peer", "name", switch_end)
            _ip("link", "set", host_end, "netns", ns)
            _ip("link", "set", switch_end, "netns", self.switch)
            _ip("-n", ns, "link", "set", host_end, "name", "eth0")
            _ip("-n", ns, "addr", "add", f"{self.addresses[i]}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
            _ip("-n", self.switch, "link", "set", switch_end, "master", "br0")
            _ip("-n", self.switch, "link", "set", switch_end, "up")

    def teardown(self) -> None:
        # deleting a namespace deletes its veth ends and kills nothing: callers stop their processes first
        for ns in [*self.names, self.switch]:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)

    def command(self, host: int, argv: list[str]) -> list[str]:
        return ["ip", "netns", "exec", self.names[host], *argv]

    def popen(self, host: int, argv: list[str], **kwargs) -> subprocess.Popen:
        return subprocess.Popen(self.command(host, argv), **kwargs)


if __name__ == "__main__":
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    reason = namespaces_work()
    if reason:
        sys.exit(reason)
    with Cluster(n) as cluster:
        for i in range(n):
            subprocess.run(cluster.command(i, ["ip", "-brief", "addr"]))
        subprocess.run(cluster.command(n - 1, ["ping", "-c", "1", "-W", "2", cluster.addresses[0]]))
