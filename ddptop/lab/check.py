"""Measuring a lab from inside it: what a TCP transfer between hosts gets, and what a busy process on a host gets.

These are the lab's ground truth: the rate comes from the receiving host's own eth0 counter over a real
transfer, the CPU share from a busy loop's own CPU clock, neither from ddptop.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass

from ddptop.errors import LabUnavailable
from ddptop.lab.cluster import Lab

PORT = 5201
_RECEIVE = r"""
import json, socket, sys, time
def rx():
    with open("/sys/class/net/eth0/statistics/rx_bytes") as f:
        return int(f.read())
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(("0.0.0.0", int(sys.argv[1])))
s.listen(1); print("ready", flush=True)
c, _ = s.accept(); buf = bytearray(1 << 20); payload = 0; first = last = None
while True:
    k = c.recv_into(buf)
    if not k:
        break
    last = time.monotonic()
    if first is None:  # the clock starts at the first byte; that chunk is not counted
        first, wire0 = last, rx()
    else:
        payload += k
print(json.dumps({"payload": payload, "wire": rx() - wire0, "first": first or 0, "last": last or 0}))
"""
_SEND = r"""
import socket, sys, time
c = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=30); chunk = b"\0" * (1 << 20)
end = time.monotonic() + float(sys.argv[3])
while time.monotonic() < end:
    c.sendall(chunk)
c.close()
"""
_BUSY = r"""
import sys, time
t0, c0 = time.monotonic(), time.process_time()
while time.monotonic() - t0 < float(sys.argv[1]):
    pass
print((time.process_time() - c0) / (time.monotonic() - t0))
"""


@dataclass(frozen=True)
class Flow:
    src: int
    dst: int
    wire_bps: float  # bits/s the receiving host's eth0 counted meanwhile (all its flows; GSO frames count once)
    goodput_bps: float  # this flow's TCP payload bits/s
    first: float  # CLOCK_MONOTONIC (one clock for every host) of its first and last byte
    last: float


def measure_flows(lab: Lab, pairs: list[tuple[int, int]], seconds: float = 2.0, quota: bool = True) -> list[Flow]:
    """Run TCP transfers src→dst, all at once, for `seconds`; the rate each receiver saw."""
    receivers = []
    for k, (_, dst) in enumerate(pairs):
        proc = lab.popen(dst, [sys.executable, "-c", _RECEIVE, str(PORT + k)], quota=quota,
                         stdout=subprocess.PIPE, text=True)
        receivers.append(proc)
        if proc.stdout is None or proc.stdout.readline().strip() != "ready":
            raise LabUnavailable(f"the link check could not listen on node {dst}")
    senders = [lab.popen(src, [sys.executable, "-c", _SEND, lab.addresses[dst], str(PORT + k), str(seconds)],
                         quota=quota) for k, (src, dst) in enumerate(pairs)]
    flows = []
    for (src, dst), sender, receiver in zip(pairs, senders, receivers):
        sender.wait(timeout=seconds + 60)
        out, _ = receiver.communicate(timeout=60)
        got = json.loads(out.strip().splitlines()[-1])
        span = (got["last"] - got["first"]) or float("nan")
        flows.append(Flow(src, dst, got["wire"] * 8 / span, got["payload"] * 8 / span, got["first"], got["last"]))
    return flows


def measure_cpu(lab: Lab, nodes: list[int], seconds: float = 2.0) -> list[float]:
    """Cores a busy loop gets on each of `nodes` (all busy at once), by its own CPU clock."""
    procs = [lab.popen(i, [sys.executable, "-c", _BUSY, str(seconds)], stdout=subprocess.PIPE, text=True)
             for i in nodes]
    return [float(p.communicate(timeout=seconds + 60)[0]) for p in procs]


def report(lab: Lab, seconds: float = 2.0) -> list[str]:
    """`ddptop lab --check`: the link one way, both ways at once, into one host from two, and the CPU quotas."""
    def rate(bps: float) -> str:
        return f"{bps / 1e6:.0f} Mbit/s" if bps < 1e9 else f"{bps / 1e9:.2f} Gbit/s"

    lines = [f"link set to {lab.link.describe()}; CPU quota {lab.cpus if lab.cpus is not None else 'none'}"]
    if lab.nodes >= 2:
        one = measure_flows(lab, [(1, 0)], seconds)[0]
        lines.append(f"  1→0 alone:        {rate(one.wire_bps)} on the wire ({rate(one.goodput_bps)} TCP payload)")
        both = measure_flows(lab, [(0, 1), (1, 0)], seconds)
        lines.append(f"  0→1 and 1→0:      {rate(both[0].wire_bps)} and {rate(both[1].wire_bps)} (full duplex)")
    if lab.nodes >= 3:  # two senders into one host: its bridge port, not theirs, must hold them to the rate
        into = measure_flows(lab, [(1, 0), (2, 0)], seconds)
        span = max(f.last for f in into) - min(f.first for f in into)
        total = sum(f.goodput_bps * (f.last - f.first) for f in into) / span
        lines.append(f"  1→0 and 2→0:      {rate(total)} TCP payload into node 0 together")
    cpu = measure_cpu(lab, list(range(lab.nodes)), seconds)
    lines.append(f"  busy loop on each node at once: {', '.join(f'{c:.2f}' for c in cpu)} CPU")
    return lines
