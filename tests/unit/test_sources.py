"""Tests for ddptop.sources: NIC accounting, the job interface (also in real network namespaces), GPU, sampler."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
import uuid
from collections import namedtuple
from pathlib import Path

import psutil
import pytest

from calibrate import Calibrated

from ddptop.errors import UsageError
from ddptop.events import SystemSample, event_from_dict
from ddptop.sources import GpuReader, NicTracker, SystemSampler, job_interface, loopback_interface

REPO = Path(__file__).resolve().parents[2]
Counters = namedtuple("Counters", "bytes_sent bytes_recv packets_sent packets_recv errin errout dropin dropout")


def counters(rx=0, tx=0, rx_p=0, tx_p=0, errors=0, drops=0):
    return Counters(tx, rx, tx_p, rx_p, errors, errors, drops, drops)


class Feed:
    """Fake counters and clock: `push(t, {iface: Counters})` sets what the next read returns."""

    def __init__(self, t=0.0, snapshot=None):
        self.t, self.snapshot = t, snapshot or {}

    def push(self, t, snapshot):
        self.t, self.snapshot = t, snapshot

    def tracker(self):
        return NicTracker(read_counters=lambda: self.snapshot, clock=lambda: self.t)


def by_name(stats):
    return {s.iface: s for s in stats}


def assert_non_negative(stat):
    for name, value in vars(stat).items():
        if name not in ("iface", "speed_by", "speed_bits_per_s"):  # a speed is None (unknown) or positive
            assert value >= 0, (name, value)


# ---- NicTracker ---------------------------------------------------------------------------------


def test_steady_rates_totals_and_peaks():
    feed = Feed(0.0, {"eth0": counters(rx=1000, tx=500, rx_p=10, tx_p=5)})
    tracker = feed.tracker()
    feed.push(1.0, {"eth0": counters(rx=3000, tx=1500, rx_p=30, tx_p=15, errors=1, drops=2)})
    eth = by_name(tracker.sample())["eth0"]
    assert (eth.rx_rate, eth.tx_rate) == (2000.0, 1000.0)
    feed.push(3.0, {"eth0": counters(rx=5000, tx=2500, rx_p=50, tx_p=25, errors=1, drops=2)})
    eth = by_name(tracker.sample())["eth0"]
    assert (eth.rx_rate, eth.tx_rate) == (1000.0, 500.0)
    assert (eth.rx_bytes, eth.tx_bytes, eth.rx_packets, eth.tx_packets) == (4000, 2000, 40, 20)
    assert (eth.rx_errors, eth.tx_errors, eth.rx_drops, eth.tx_drops) == (1, 1, 2, 2)
    assert (eth.peak_rx_rate, eth.peak_tx_rate) == (2000.0, 1000.0)


def test_counter_reset_or_wrap_gives_no_negative_numbers_and_rebases():
    feed = Feed(0.0, {"eth0": counters(rx=10_000, tx=10_000)})
    tracker = feed.tracker()
    feed.push(1.0, {"eth0": counters(rx=12_000, tx=11_000)})
    tracker.sample()
    feed.push(2.0, {"eth0": counters(rx=100, tx=50)})  # reset: counters went backwards
    eth = by_name(tracker.sample())["eth0"]
    assert_non_negative(eth)
    assert (eth.rx_rate, eth.tx_rate) == (0.0, 0.0)
    assert (eth.rx_bytes, eth.tx_bytes) == (2000, 1000)
    feed.push(3.0, {"eth0": counters(rx=600, tx=250)})  # counts again from the new base
    eth = by_name(tracker.sample())["eth0"]
    assert (eth.rx_rate, eth.tx_rate, eth.rx_bytes, eth.tx_bytes) == (500.0, 200.0, 2500, 1200)


def test_interface_that_disappears_and_comes_back():
    feed = Feed(0.0, {"lo": counters(), "ib0": counters(rx=5000, tx=5000)})
    tracker = feed.tracker()
    feed.push(1.0, {"lo": counters(), "ib0": counters(rx=6000, tx=7000)})
    tracker.sample()
    feed.push(2.0, {"lo": counters()})
    assert set(by_name(tracker.sample())) == {"lo"}
    feed.push(3.0, {"lo": counters(), "ib0": counters(rx=300, tx=400)})  # re-created: counters restart
    ib = by_name(tracker.sample())["ib0"]
    assert_non_negative(ib)
    assert (ib.rx_rate, ib.tx_rate, ib.rx_bytes, ib.tx_bytes) == (0.0, 0.0, 1000, 2000)
    feed.push(4.0, {"lo": counters(), "ib0": counters(rx=1300, tx=1400)})
    ib = by_name(tracker.sample())["ib0"]
    assert (ib.rx_rate, ib.rx_bytes, ib.tx_bytes, ib.peak_tx_rate) == (1000.0, 2000, 3000, 2000.0)


def test_interface_appearing_later_starts_from_its_first_reading():
    feed = Feed(0.0, {"lo": counters()})
    tracker = feed.tracker()
    feed.push(1.0, {"lo": counters(), "veth9": counters(rx=10**9, tx=10**9)})
    veth = by_name(tracker.sample())["veth9"]
    assert (veth.rx_rate, veth.rx_bytes, veth.peak_rx_rate) == (0.0, 0, 0.0)
    feed.push(2.0, {"lo": counters(), "veth9": counters(rx=10**9 + 64, tx=10**9)})
    assert by_name(tracker.sample())["veth9"].rx_bytes == 64


def test_zero_interval_gives_zero_rate_not_an_error():
    feed = Feed(5.0, {"eth0": counters(rx=1)})
    tracker = feed.tracker()
    feed.push(5.0, {"eth0": counters(rx=2)})
    eth = by_name(tracker.sample())["eth0"]
    assert (eth.rx_rate, eth.rx_bytes) == (0.0, 1)


def test_real_counters_cover_every_interface():
    stats = NicTracker().sample()
    assert {s.iface for s in stats} == set(psutil.net_io_counters(pernic=True))
    for s in stats:
        assert_non_negative(s)


# ---- job_interface --------------------------------------------------------------------------------


def test_loopback_master_gives_loopback_interface():
    lo = loopback_interface()
    assert lo in psutil.net_if_addrs()
    assert job_interface("127.0.0.1") == lo
    assert job_interface("localhost") == lo


def test_address_of_this_host_gives_the_interface_holding_it():
    """On the master node the other nodes' traffic arrives on the NIC that holds the master address."""
    for name, addrs in psutil.net_if_addrs().items():
        for a in addrs:
            if a.family.name == "AF_INET":
                assert job_interface(a.address) == name


def test_unresolvable_master_falls_back_to_loopback():
    assert job_interface("no-such-host.invalid") == loopback_interface()
    assert job_interface("") == loopback_interface()


def test_explicit_interface():
    lo = loopback_interface()
    assert job_interface("10.9.9.9", iface=lo) == lo
    with pytest.raises(UsageError) as info:
        job_interface("127.0.0.1", iface="nosuchnic0")
    message = str(info.value)
    assert "\n" not in message and "nosuchnic0" in message and lo in message


# ---- real network namespaces --------------------------------------------------------------------


def ip(*args, check=True):
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=10, check=check)


@pytest.fixture
def netns_pair():
    """Two namespaces joined by a veth pair: (ns_a, veth_a, 192.0.2.1) <-> (ns_b, veth_b, 192.0.2.2)."""
    if shutil.which("ip") is None:
        pytest.skip("the `ip` command is not installed")
    tag = uuid.uuid4().hex[:8]
    ns_a, ns_b = f"ddptop-a-{tag}", f"ddptop-b-{tag}"
    veth_a, veth_b = f"vda{tag}", f"vdb{tag}"  # interface names are limited to 15 characters
    made = []
    try:
        for ns in (ns_a, ns_b):
            result = ip("netns", "add", ns, check=False)
            if result.returncode != 0:
                pytest.skip(f"`ip netns add` is not permitted here: {result.stderr.strip()}")
            made.append(ns)
        ip("link", "add", veth_a, "netns", ns_a, "type", "veth", "peer", "name", veth_b, "netns", ns_b)
        for ns, veth, address in ((ns_a, veth_a, "192.0.2.1/24"), (ns_b, veth_b, "192.0.2.2/24")):
            ip("-n", ns, "addr", "add", address, "dev", veth)
            ip("-n", ns, "link", "set", veth, "up")
            ip("-n", ns, "link", "set", "lo", "up")
        yield ns_a, veth_a, ns_b, veth_b
    finally:
        for ns in made:  # deleting a namespace deletes its end of the veth, and with it the pair
            ip("netns", "del", ns, check=False)


def in_netns(ns, code, **kwargs):
    command = ["ip", "netns", "exec", ns, sys.executable, "-c", code]
    return subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs)


def run_in_netns(ns, code):
    proc = in_netns(ns, code)
    out, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err
    return json.loads(out)


def test_job_interface_in_network_namespaces(netns_pair):
    ns_a, veth_a, ns_b, veth_b = netns_pair
    code = (
        "import json; from ddptop.sources.system import job_interface as j; "
        "print(json.dumps([j('192.0.2.1'), j('192.0.2.2'), j('198.51.100.7'), j('127.0.0.1')]))"
    )
    routed, own, unroutable, loop = run_in_netns(ns_b, code)
    assert routed == own == veth_b
    assert loop == "lo"
    assert unroutable == "lo"  # no default route inside the namespace: fall back, never raise


SPEEDS = """
import json, os, sys
from ddptop.events import LINK_ENV
from ddptop.sources import SystemSampler
veth = sys.argv[1]
out = []
for env in ("", "1e9"):
    os.environ[LINK_ENV] = env
    sample = SystemSampler(0, "a", veth, lambda s: None).sample()
    out.append({n.iface: [n.speed_bits_per_s, n.speed_by] for n in sample.nics})
print(json.dumps(out))
"""


def test_sampled_nics_carry_the_kernels_link_speed_or_the_labs_shaped_rate(netns_pair):
    """Ground truth: the kernel's own /sys/class/net/<veth>/speed (Mbit/s) in the namespace, and the rate the lab
    hands its jobs in LINK_ENV, which wins on the job's interface; loopback has no speed and says unknown."""
    ns_a, veth_a, _, _ = netns_pair
    sysfs = float(ip("netns", "exec", ns_a, "cat", f"/sys/class/net/{veth_a}/speed").stdout)
    proc = subprocess.run(["ip", "netns", "exec", ns_a, sys.executable, "-c", SPEEDS, veth_a], cwd=REPO,
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    plain, lab = json.loads(proc.stdout)
    assert sysfs > 0 and plain[veth_a] == [sysfs * 1e6, "reported by the NIC"]
    assert lab[veth_a] == [1e9, "shaped by ddptop lab"]
    assert plain["lo"] == lab["lo"] == [None, ""]


RECEIVER = """
import socket
srv = socket.create_server(("192.0.2.2", 0))
print(srv.getsockname()[1], flush=True)
conn, _ = srv.accept()
got = 0
while chunk := conn.recv(1 << 16):
    got += len(chunk)
conn.sendall(str(got).encode())
conn.close()
"""

SENDER = """
import json, socket, sys
from ddptop.sources.system import NicTracker
tracker = NicTracker()
with socket.create_connection(("192.0.2.2", int(sys.argv[1])), timeout=10) as s:
    s.sendall(b"x" * (1 << 20))
    s.shutdown(socket.SHUT_WR)
    acked = int(s.recv(64))
stat = {n.iface: n for n in tracker.sample()}[sys.argv[2]]
print(json.dumps({"acked": acked, "tx": stat.tx_bytes, "tx_packets": stat.tx_packets, "rx": stat.rx_bytes}))
"""


def test_nic_tracker_counts_real_traffic_between_namespaces(netns_pair):
    ns_a, veth_a, ns_b, veth_b = netns_pair
    receiver = in_netns(ns_b, RECEIVER)
    try:
        port = receiver.stdout.readline().strip()
        assert port, receiver.stderr.read()
        code = SENDER.replace("sys.argv[1]", repr(port)).replace("sys.argv[2]", repr(veth_a))
        result = run_in_netns(ns_a, code)
    finally:
        receiver.kill()
        receiver.communicate()
    assert result["acked"] == 1 << 20
    assert result["tx"] >= 1 << 20  # payload plus TCP/IP headers
    assert result["tx_packets"] > 0 and result["rx"] > 0  # the receiver's ACKs


# ---- GPU --------------------------------------------------------------------------------------------


def test_gpu_reader_without_gpu_reports_not_available():
    pynvml = pytest.importorskip("pynvml")
    try:
        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
        pytest.skip("this machine has a working NVIDIA driver")
    except pynvml.NVMLError:
        pass
    reader = GpuReader([0])
    status, stats = reader.read()
    assert status.startswith("not available: ") and stats == ()
    assert reader.read() == (status, ())
    reader.close()


# The NVML fake and the reader's fields and device mapping: tests/unit/test_gpu_nvml.py


# ---- SystemSampler ----------------------------------------------------------------------------------


def wait_for(done, what: str, timeout_s: float = 30) -> None:
    """Until `done()`, polled; fails naming `what` after `timeout_s` (the sampler's thread may start late)."""
    deadline = time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < deadline, f"no {what} within {timeout_s:g} s"
        time.sleep(0.05)


def test_sampler_delivers_samples_that_round_trip_and_stops_cleanly():
    samples = []
    sampler = SystemSampler(0, "node0", loopback_interface(), samples.append, interval_s=0.5)
    sampler.start()
    wait_for(lambda: len(samples) >= 2, "two samples")  # one every 0.5 s
    sampler.stop()
    sampler.stop()
    assert not any(t.name.startswith("ddptop-sampler") for t in threading.enumerate())
    assert len(samples) >= 2
    for sample in samples:
        assert isinstance(sample, SystemSample)
        assert event_from_dict(json.loads(json.dumps(sample.to_dict()))) == sample
        assert sample.nic() is not None and sample.node_mem_total_bytes > 0
        assert sample.gpu_status.startswith(("ok", "not available"))
    assert samples[-1].t > samples[0].t


def test_a_sampler_stopped_before_its_first_interval_still_sends_one_sample():
    """A rank that trains for less than an interval (a short job) still says its system once, at its stop."""
    samples = []
    sampler = SystemSampler(0, "node0", loopback_interface(), samples.append, interval_s=30)
    sampler.start()
    with Calibrated() as cal:
        started = time.monotonic()
        sampler.stop()
        took = time.monotonic() - started
    assert took < min(cal.bound(2), 15), (took, cal.factor)  # at once (calibrate.py), not after the 30 s interval
    assert len(samples) == 1 and samples[0].nic() is not None and samples[0].node_mem_total_bytes > 0


def test_sampler_survives_failing_reader_and_sink(capsys):
    calls = []

    def sink(sample):
        calls.append(sample)
        raise RuntimeError("sink down")

    sampler = SystemSampler(1, "node1", "lo", sink, interval_s=0.05)
    sampler._nics._read = lambda: 1 / 0  # a broken counter source
    sampler.start()
    wait_for(lambda: len(calls) >= 2, "two calls of the failing sink")  # one every 0.05 s, each failing
    sampler.stop()
    assert len(calls) >= 2 and all(s.nics == () and s.node_mem_total_bytes > 0 for s in calls)
    err = capsys.readouterr().err
    assert err.count("network counters failed") == 1 and err.count("sink failed") == 1


# ---- node CPU inside a CPU quota cgroup (a lab node) ------------------------------------------------------------

BUSY_NODE = """
import json, subprocess, sys, time
from ddptop.sources.system import CpuMemReader
busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])  # the node's only load: it inherits the cgroup
time.sleep(0.5)
reader = CpuMemReader()
print("ready", flush=True)
time.sleep(1.5)
cpu = reader.read()
busy.kill()
print(json.dumps([cpu.node_cpu_percent, cpu.node_cpu_quota]), flush=True)
"""


def _v1_cgroup(controller):
    for line in Path("/proc/self/mounts").read_text().splitlines():
        point, kind, options = line.split()[1:4]
        if kind == "cgroup" and controller in options.split(","):
            return Path(point)
    pytest.skip(f"no cgroup v1 {controller} hierarchy here (this check reads cgroup v1's cpuacct.usage)")


@pytest.mark.alone
@pytest.mark.parametrize("netns", [False, True], ids=["cgroup files", "ip netns exec"])
def test_node_cpu_in_a_quota_cgroup_is_its_share_of_the_quota(netns):
    """A cgroup with a 0.5-core quota and one busy loop in it: the node CPU is the cgroup's CPU time over its
    quota, checked against the kernel's own cpuacct.usage for the same cgroup (a twin in the cpuacct hierarchy) over
    the same window, and far from the whole machine's share. Under `ip netns exec` (how the lab starts its ranks)
    no cgroup files are mounted: the lab's DDPTOP_LAB_CPUS gives the quota there."""
    share, quota, truth = _node_cpu_in_a_quota_cgroup(BUSY_NODE, netns)
    assert quota == 0.5 and truth > 70  # the busy loop fills its quota: the kernel counted it
    assert abs(share - truth) < 15, (share, truth)
    assert share > 100 * 0.5 / psutil.cpu_count() + 25  # not the machine's share: a half core of all of them


# A DataLoader worker's life inside a lab node: busy when the reader starts, gone (killed and reaped) mid-interval.
WORKER_LEAVES = """
import json, subprocess, sys, time
from ddptop.sources.system import CpuMemReader
busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
time.sleep(0.5)
reader = CpuMemReader()
print("ready", flush=True)
time.sleep(0.5)
busy.kill()
busy.wait()  # reaped by its parent, a member of the same cgroup, as torch reaps its DataLoader workers
time.sleep(0.5)
cpu = reader.read()
print(json.dumps([cpu.node_cpu_percent, cpu.node_cpu_quota]), flush=True)
"""


@pytest.mark.alone
def test_node_cpu_keeps_the_time_of_a_process_that_left_the_quota_cgroup():
    """Issue 44: under `ip netns exec` the node's CPU time is the sum over its processes, and one that left took
    its time with it: the sum fell and the node read 0% while it had been busy (the report's "node at 0%" on a
    saturated machine, each time the DataLoader's workers ended). The kernel's cpuacct.usage for the same cgroup
    counts the worker's half second; the node CPU must say the same share, not 0."""
    share, quota, truth = _node_cpu_in_a_quota_cgroup(WORKER_LEAVES, netns=True)
    assert quota == 0.5 and truth > 35  # busy for half of the window at its quota: the kernel counted it
    assert abs(share - truth) < 15, (share, truth)


def _node_cpu_in_a_quota_cgroup(script, netns):
    """Run `script` in a fresh cgroup with a 0.5-core quota: (its node CPU share, its quota, the kernel's share over
    the window from its "ready" line to its result line)."""
    tag = f"ddptop-test-{uuid.uuid4().hex[:8]}"
    cpu, acct = _v1_cgroup("cpu") / tag, _v1_cgroup("cpuacct") / tag
    made, ns = [], f"ddptop-c-{tag[-8:]}"
    try:
        for group in (cpu, acct):
            group.mkdir()
            made.append(group)
        (cpu / "cpu.cfs_period_us").write_text("10000")
        (cpu / "cpu.cfs_quota_us").write_text("5000")

        def join():
            for group in (cpu, acct):
                (group / "cgroup.procs").write_text(str(os.getpid()))

        argv = [sys.executable, "-c", script]
        if netns:
            ip("netns", "add", ns)
            argv = ["ip", "netns", "exec", ns, *argv]
        env = {**os.environ, "DDPTOP_LAB_CPUS": "0.5"}
        proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE, text=True, preexec_fn=join)
        assert proc.stdout.readline().strip() == "ready"
        used0, t0 = int((acct / "cpuacct.usage").read_text()), time.monotonic()
        share, quota = json.loads(proc.stdout.readline())
        used1, t1 = int((acct / "cpuacct.usage").read_text()), time.monotonic()
        proc.wait(timeout=10)
        return share, quota, 100 * (used1 - used0) / 1e9 / ((t1 - t0) * 0.5)
    finally:
        if netns:
            ip("netns", "del", ns, check=False)
        for group in reversed(made):
            for pid in (group / "cgroup.procs").read_text().split():
                os.kill(int(pid), 9)
            for _ in range(100):
                try:
                    group.rmdir()
                    break
                except OSError:
                    time.sleep(0.05)
