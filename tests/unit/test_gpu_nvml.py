"""GpuReader against a fake NVML module (no GPU here): every field, unsupported metrics, NVLink rates, and which
NVML device a rank's CUDA device is (UUIDs, prefixes, MIG, CUDA_VISIBLE_DEVICES, CUDA_DEVICE_ORDER).

The fake models a node the way pynvml presents it: GPUs in PCI bus order (NVML's index), each with a UUID, MIG
instances under a GPU with their own UUIDs, NVLink counters in KiB, per-process memory, NVMLError subclasses for
what a board does not support. Only the calls GpuReader makes exist, so a new call fails here first."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from ddptop.events import GpuStat, SystemSample, event_from_dict
from ddptop.record import schema
from ddptop.sources.gpu import GpuReader

ME = 4242  # this "process"'s pid


class NVMLError(Exception):
    pass


class NVMLError_NotSupported(NVMLError):
    pass


class NVMLError_NotFound(NVMLError):
    pass


class NVMLError_DriverNotLoaded(NVMLError):
    pass


def gpu(name="NVIDIA H100 80GB HBM3", uuid="GPU-00000000-aaaa", links=0, migs=(), power=True, energy_mj=0):
    """energy_mj: the total-energy counter (None: the board has none, as before Volta)."""
    return {"name": name, "uuid": uuid, "links": links, "migs": list(migs), "power": power,
            "nvlink": [0, 0], "procs": [(ME, 3 << 30), (999, 1 << 30)], "energy_mj": energy_mj}


class FakeNvml:
    NVMLError, NVMLError_NotSupported, NVMLError_NotFound = NVMLError, NVMLError_NotSupported, NVMLError_NotFound
    NVML_TEMPERATURE_GPU, NVML_CLOCK_SM = 0, 1
    NVML_PCIE_UTIL_TX_BYTES, NVML_PCIE_UTIL_RX_BYTES = 0, 1
    NVML_NVLINK_MAX_LINKS, NVML_FEATURE_ENABLED = 18, 1

    def __init__(self, gpus, fail_init=None):
        self.gpus, self.fail_init, self.shutdowns = gpus, fail_init, 0

    # -- devices and handles: ("gpu", i) or ("mig", i, slot)
    def nvmlInit(self):
        if self.fail_init:
            raise self.fail_init

    def nvmlShutdown(self):
        self.shutdowns += 1

    def nvmlDeviceGetCount(self):
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i):
        if not 0 <= i < len(self.gpus):
            raise NVMLError("Invalid Argument")
        return ("gpu", i)

    def nvmlDeviceGetHandleByUUID(self, uuid):
        for i, g in enumerate(self.gpus):
            if g["uuid"] == uuid:
                return ("gpu", i)
            for slot, m in enumerate(g["migs"]):
                if m["uuid"] == uuid:
                    return ("mig", i, slot)
        raise NVMLError_NotFound("Not Found")

    def nvmlDeviceGetIndex(self, h):
        if h[0] == "mig":
            raise NVMLError_NotSupported("Not Supported")
        return h[1]

    def nvmlDeviceIsMigDeviceHandle(self, h):
        return h[0] == "mig"

    def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, h):
        return ("gpu", h[1])

    def nvmlDeviceGetMaxMigDeviceCount(self, h):
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h, slot):
        if slot >= len(self.gpus[h[1]]["migs"]):
            raise NVMLError_NotFound("Not Found")
        return ("mig", h[1], slot)

    def _item(self, h):
        g = self.gpus[h[1]]
        return g["migs"][h[2]] if h[0] == "mig" else g

    def nvmlDeviceGetGpuInstanceId(self, h):
        return self._item(h)["gi"]

    def nvmlDeviceGetComputeInstanceId(self, h):
        return self._item(h)["ci"]

    def nvmlDeviceGetUUID(self, h):
        return self._item(h)["uuid"]

    def nvmlDeviceGetName(self, h):
        return self._item(h)["name"].encode()

    # -- metrics
    def _physical_only(self, h):
        if h[0] == "mig":
            raise NVMLError_NotSupported("Not Supported")

    def nvmlDeviceGetUtilizationRates(self, h):
        self._physical_only(h)
        return SimpleNamespace(gpu=87, memory=40)

    def nvmlDeviceGetMemoryInfo(self, h):
        total = 10 << 30 if h[0] == "mig" else 80 << 30
        return SimpleNamespace(total=total, free=total - (5 << 30), used=5 << 30)

    def nvmlDeviceGetPowerUsage(self, h):
        self._physical_only(h)
        if not self._item(h)["power"]:
            raise NVMLError_NotSupported("Not Supported")
        return 312_500

    def nvmlDeviceGetTotalEnergyConsumption(self, h):
        self._physical_only(h)
        if self._item(h).get("energy_mj") is None:
            raise NVMLError_NotSupported("Not Supported")
        return self._item(h)["energy_mj"]

    def nvmlDeviceGetTemperature(self, h, sensor):
        self._physical_only(h)
        return 64

    def nvmlDeviceGetClockInfo(self, h, kind):
        assert kind == self.NVML_CLOCK_SM
        return 1980

    def nvmlDeviceGetPcieThroughput(self, h, counter):
        self._physical_only(h)
        return {self.NVML_PCIE_UTIL_RX_BYTES: 1000, self.NVML_PCIE_UTIL_TX_BYTES: 250}[counter]  # KB/s

    def nvmlDeviceGetNvLinkState(self, h, link):
        self._physical_only(h)
        if link >= self._item(h)["links"]:
            raise NVMLError_NotSupported("Not Supported") if link == 0 else NVMLError("Invalid Argument")
        return self.NVML_FEATURE_ENABLED

    def nvmlDeviceGetFieldValues(self, h, fields):
        tx, rx = self._item(h)["nvlink"]
        assert [f for f, _ in fields] == [138, 139] and all(scope == 0xFFFFFFFF for _, scope in fields)
        return [SimpleNamespace(nvmlReturn=0, value=SimpleNamespace(ullVal=v)) for v in (tx, rx)]

    def nvmlDeviceGetComputeRunningProcesses(self, h):
        return [SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in self._item(h)["procs"]]


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def reader(nvml, indices=None, uuids=None, env=None, clock=None):
    return GpuReader(indices, nvml=nvml, uuids=uuids, env=env if env is not None else {}, pid=ME,
                     clock=clock or Clock())


# ---- fields ---------------------------------------------------------------------------------------------

def test_every_field_of_a_gpu_with_nvlink():
    node, clock = [gpu(links=4)], Clock()
    r = reader(FakeNvml(node), [0], env={}, clock=clock)
    status, (first,) = r.read()
    assert status == "ok"
    assert (first.index, first.name, first.uuid) == (0, "NVIDIA H100 80GB HBM3", "GPU-00000000-aaaa")
    assert (first.util_percent, first.mem_used_bytes, first.mem_total_bytes) == (87.0, 5 << 30, 80 << 30)
    assert (first.power_w, first.temp_c, first.sm_clock_mhz) == (312.5, 64.0, 1980.0)
    assert (first.pcie_rx_bytes_s, first.pcie_tx_bytes_s) == (1000 * 1024, 250 * 1024)
    assert first.proc_mem_bytes == 3 << 30  # this process's, not the other one's
    assert first.energy_j == 0.0  # the counter, in joules (NVML gives mJ)
    node[0]["energy_mj"] = 123_456_789
    assert r.read()[1][0].energy_j == 123_456.789
    node[0]["energy_mj"] = None  # a board without the counter: that field only
    assert r.read()[1][0].energy_j is None and r.read()[1][0].power_w == 312.5
    assert (first.nvlink_rx_bytes_s, first.nvlink_tx_bytes_s) == (None, None)  # a rate needs two readings
    node[0]["nvlink"] = [2_000_000, 1_000_000]  # KiB sent, received since the last read
    clock.t += 0.5
    _, (second,) = r.read()
    assert second.nvlink_tx_bytes_s == 2_000_000 * 1024 / 0.5 and second.nvlink_rx_bytes_s == 1_000_000 * 1024 / 0.5
    node[0]["nvlink"] = [5, 5]  # counters reset (driver reload): no negative rate
    clock.t += 0.5
    _, (third,) = r.read()
    assert (third.nvlink_rx_bytes_s, third.nvlink_tx_bytes_s) == (None, None)


def test_unsupported_metrics_are_none_for_that_field_only():
    node = [gpu(), gpu(name="Tesla T4", uuid="GPU-11111111-bbbb", power=False)]
    node[1]["procs"] = [(999, 1 << 30)]  # NVML does not list this process (another PID namespace)
    status, (plain, t4) = reader(FakeNvml(node)).read()  # every GPU of the node (no indices)
    assert status == "ok" and plain.nvlink_rx_bytes_s is None and plain.power_w == 312.5  # no NVLink on it
    assert (t4.power_w, t4.proc_mem_bytes, t4.util_percent, t4.index) == (None, None, 87.0, 1)


def test_driver_not_loaded_and_close_once():
    nvml = FakeNvml([gpu()], fail_init=NVMLError_DriverNotLoaded("Driver Not Loaded"))
    r = reader(nvml, [0])
    assert r.read() == ("not available: NVIDIA driver not loaded", ())
    r.close()
    assert nvml.shutdowns == 0
    nvml = FakeNvml([gpu()])
    r = reader(nvml, [0])
    assert r.read()[0] == "ok"
    r.close()
    r.close()
    assert nvml.shutdowns == 1


def test_a_cpu_rank_says_so():
    assert reader(FakeNvml([gpu()]), []).read() == ("not available: this rank trains on the CPU", ())


# ---- which device ------------------------------------------------------------------------------------------

NODE = [gpu(uuid="GPU-0a0a0a0a-0000"), gpu(uuid="GPU-1b1b1b1b-1111"), gpu(uuid="GPU-2c2c2c2c-2222")]


def indices(env, cuda_indices, uuids=None, node=NODE):
    status, stats = reader(FakeNvml(node), cuda_indices, uuids=uuids, env=env).read()
    return [g.index for g in stats] if status == "ok" else status


@pytest.mark.parametrize("env,cuda_indices,want", [
    ({}, [0, 2], [0, 2]),
    ({"CUDA_VISIBLE_DEVICES": "2,0"}, [0, 1], [2, 0]),
    ({"CUDA_VISIBLE_DEVICES": "1"}, [0], [1]),
    ({"CUDA_VISIBLE_DEVICES": "GPU-2c2c"}, [0], [2]),  # CUDA takes a unique UUID prefix
    ({"CUDA_VISIBLE_DEVICES": "GPU-1b1b1b1b-1111,GPU-0a0a"}, [1], [0]),
    ({"CUDA_VISIBLE_DEVICES": "2,bogus,0"}, [0], [2]),  # CUDA stops at the first invalid entry...
    ({"CUDA_VISIBLE_DEVICES": "2,bogus,0"}, [1], "not available: no GPU with index 1 (1 visible)"),  # ...and so do we
    ({"CUDA_VISIBLE_DEVICES": "GPU-"}, [0], "not available: CUDA_VISIBLE_DEVICES names GPU-, which matches 3 GPUs"),
    ({"CUDA_VISIBLE_DEVICES": "5"}, [0], "not available: CUDA_VISIBLE_DEVICES names GPU 5, and there are 3"),
])
def test_cuda_visible_devices_is_read_as_cuda_reads_it(env, cuda_indices, want):
    assert indices(env, cuda_indices) == want


def test_the_uuid_cuda_reports_wins_over_the_environment():
    # torch prints the bytes without the "GPU-" prefix; the environment says something else entirely
    assert indices({"CUDA_VISIBLE_DEVICES": "0"}, [0], uuids=["2c2c2c2c-2222"]) == [2]
    assert indices({}, [0], uuids=["GPU-1b1b1b1b-1111"]) == [1]
    assert indices({}, [0], uuids=["deadbeef"]) == "not available: no GPU with UUID deadbeef"


class BareAnsweringNvml(FakeNvml):
    """Driver 580 on an H200 (the first GPU run, scripts/gpu_check.sh cuda) also answers a UUID without its prefix."""

    def nvmlDeviceGetHandleByUUID(self, uuid):
        for i, g in enumerate(self.gpus):
            if uuid in (g["uuid"], g["uuid"].split("-", 1)[1]):
                return ("gpu", i)
        raise NVMLError_NotFound("Not Found")


def test_the_uuid_shown_is_the_one_nvidia_smi_prints():
    for fake in (FakeNvml(NODE), BareAnsweringNvml(NODE)):
        status, stats = reader(fake, [0], uuids=["2c2c2c2c-2222"], env={}).read()
        assert status == "ok" and [(g.index, g.uuid) for g in stats] == [(2, "GPU-2c2c2c2c-2222")], type(fake)


def test_device_order_fastest_first_is_nvml_order_only_for_one_model():
    mixed = [gpu(name="NVIDIA A100", uuid="GPU-a"), gpu(name="NVIDIA H100", uuid="GPU-h")]
    refused = indices({"CUDA_VISIBLE_DEVICES": "1"}, [0], node=mixed)
    assert refused.startswith("not available: ") and "CUDA_DEVICE_ORDER=PCI_BUS_ID" in refused
    assert indices({"CUDA_VISIBLE_DEVICES": "1", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}, [0], node=mixed) == [1]
    assert indices({"CUDA_VISIBLE_DEVICES": "1"}, [0]) == [1]  # one model: FASTEST_FIRST ties go by PCI bus id
    assert indices({"CUDA_VISIBLE_DEVICES": "GPU-h"}, [0], node=mixed) == [1]  # a UUID needs no order


def test_a_mig_instance_reads_as_its_parent_gpu_with_its_own_memory():
    migs = [{"name": "NVIDIA A100-SXM4-40GB MIG 1g.5gb", "uuid": f"MIG-{n}{n}{n}{n}-mig", "gi": gi, "ci": 0,
             "nvlink": [0, 0], "procs": [(ME, 1 << 30)]} for n, gi in ((7, 1), (8, 2))]
    node = [gpu(name="NVIDIA A100-SXM4-40GB", uuid="GPU-aaaa-0000"),
            gpu(name="NVIDIA A100-SXM4-40GB", uuid="GPU-bbbb-1111", migs=migs)]
    for env, uuids in [({"CUDA_VISIBLE_DEVICES": "MIG-8888-mig"}, None),
                       ({"CUDA_VISIBLE_DEVICES": "MIG-GPU-bbbb-1111/2/0"}, None),  # the pre-R470 form
                       ({}, ["8888-mig"])]:
        status, (stat,) = reader(FakeNvml(node), [0], uuids=uuids, env=env).read()
        assert status == "ok" and stat.index == 1 and stat.uuid == "MIG-8888-mig", (env, uuids)
        assert stat.name.endswith("MIG 1g.5gb") and stat.mem_total_bytes == 10 << 30
        assert (stat.util_percent, stat.power_w, stat.proc_mem_bytes) == (None, None, 1 << 30)  # NVML: per GPU only
    assert indices({"CUDA_VISIBLE_DEVICES": "MIG-GPU-bbbb-1111/3/0"}, [0], node=node) == \
        "not available: no MIG instance 3/0 on GPU 1"


# ---- on the wire and in recordings ---------------------------------------------------------------------------

def test_new_fields_round_trip_and_older_rows_still_decode():
    stat = GpuStat(1, "H100", 50.0, 1, 2, 300.0, 60.0, 1980.0, 1e6, 2e6, 3e9, 4e9, 5 << 30, "GPU-x")
    sample = SystemSample(0, "n", 1.0, 1.0, 2.0, 3, 4, 5, "lo", (), (stat,), "ok")
    assert event_from_dict(json.loads(json.dumps(sample.to_dict()))) == sample
    _, row = schema.encode(sample, 1, 1.0)
    assert schema.decode_row("system", row) == sample
    # a system row written before these fields existed: seven values per GPU; and a live event without them
    old = list(row)
    old[2 + schema.SYSTEM_FIELDS.index("gpus")] = json.dumps([[0, "V100", 99.0, 7, 8, 250.0, 70.0]])
    (back,) = schema.decode_row("system", tuple(old)).gpus
    assert back == GpuStat(0, "V100", 99.0, 7, 8, 250.0, 70.0) and back.sm_clock_mhz is None and back.uuid == ""
    data = sample.to_dict()
    data["gpus"] = [{k: v for k, v in g.items() if k in ("index", "name", "util_percent", "mem_used_bytes",
                                                         "mem_total_bytes", "power_w", "temp_c")} for g in data["gpus"]]
    assert event_from_dict(data).gpus[0].proc_mem_bytes is None
    old[2 + schema.SYSTEM_FIELDS.index("gpus")] = json.dumps([[0, "V100", 99.0, 7, 8, 250.0]])  # too short
    with pytest.raises(schema.EventDecodeError):
        schema.decode_row("system", tuple(old))


def test_the_screens_get_a_history_of_every_gpu_number():
    from ddptop.state.session import SessionState

    state = SessionState()
    for util, nvlink in ((40.0, None), (90.0, 2e9)):
        stat = GpuStat(0, "H100", util, 5, 8, 300.0, 60.0, 1980.0, 1e6, 2e6, nvlink, nvlink, 3, "GPU-x")
        state.apply(SystemSample(0, "n", 1.0, 1.0, 2.0, 3, 4, 5, "lo", (), (stat,), "ok"))
    view = state.snapshot().util[0]
    assert view.gpu == (40.0, 90.0) and view.nvlink_rx == (0.0, 2e9) and view.proc_gpu_mem == (3.0, 3.0)
    assert (view.sm_clock[-1], view.pcie_rx[-1], view.pcie_tx[-1], view.temp[-1]) == (1980.0, 1e6, 2e6, 60.0)
