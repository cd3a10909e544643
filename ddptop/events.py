"""The event vocabulary: small frozen dataclasses that travel as JSON between ranks, files and screens.

Events carry plain numbers and strings, never tensors. `to_dict`/`event_from_dict` are the only
encoding; nothing is ever pickled, since the store and recordings can come from anyone.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

from ddptop.safe import clean_value

SCHEMA_VERSION = 1
FRONT = -1  # the rank of a LogLine the front itself says
MAX_EVENT_BYTES = 1 << 20  # one decoded event may not exceed 1 MiB: values come from the network

# Span kinds, in the order a step runs them.
SPAN_KINDS = ("data", "fwd", "bwd", "comm", "wait", "opt")


@dataclass(frozen=True)
class Event:
    kind: ClassVar[str] = "event"

    def to_dict(self) -> dict[str, Any]:
        out = {"kind": self.kind, "v": SCHEMA_VERSION}
        for f in dataclasses.fields(self):
            out[f.name] = _plain(getattr(self, f.name))
        return out


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, (tuple, list)):
        return [_plain(v) for v in value]
    return value


@dataclass(frozen=True)
class RankJoined(Event):
    """A rank passed the handshake: who and where it is."""

    kind: ClassVar[str] = "rank_joined"
    rank: int
    world_size: int
    host: str
    pid: int
    device: str
    backend: str
    threads: int
    torch_version: str
    ddptop_version: str
    rank_source: str
    t: float
    gloo_ifname: str = ""  # the interface gloo and nccl bind to (GLOO_/NCCL_SOCKET_IFNAME; older files: "")
    nccl_ifname: str = ""


@dataclass(frozen=True)
class RunStarted(Event):
    """Rank 0 describes the job once: model, data, config, parameter layout."""

    kind: ClassVar[str] = "run_started"
    model: str
    dataset: str
    world_size: int
    strategy: str
    bucket_mb: float
    async_op: bool
    batch_size: int
    lr: float
    param_count: int
    param_bytes: int
    param_tensors: int
    layers: tuple  # ((layer name, parameter count), ...)
    steps_per_epoch: int
    t: float
    total_steps: int = 0  # added after schema 1 shipped: older files decode with 0 ("unknown")
    sweep_segments: int = 0  # a profile's sweep: how many configurations it runs one after another
    warmup: int = 1  # steps at each segment's start left out of its figures (metrics.warmup_for)


@dataclass(frozen=True)
class StepDone(Event):
    """One training step of one rank, summarized. Times in seconds, bytes as counted by the comm accounting."""

    kind: ClassVar[str] = "step_done"
    rank: int
    step: int
    epoch: int
    segment: int
    t: float  # wall clock at the end of the step
    iter_s: float
    data_s: float
    compute_s: float
    comm_s: float
    exposed_comm_s: float
    overlap: float  # fraction of comm time during which compute ran (HTA's definition)
    batch_size: int
    loss: float
    comm_bytes: int  # tensor bytes handed to collectives
    tx_bytes: int  # bytes this rank puts on the wire by the algorithm (ring / gather formulas)
    rx_bytes: int
    sampled: bool  # spans were recorded for this step (layer hooks ran: left out of time figures)
    # added after schema 1 shipped (older files decode with 0): compute_s = fwd_s + bwd_s + opt_s
    fwd_s: float = 0.0
    bwd_s: float = 0.0
    opt_s: float = 0.0
    own_s: float = 0.0  # time the training thread spent in ddptop's own code during this step
    # added later still (older files and ranks: 0, their steps then seem to start after any pause inside them)
    aside_s: float = 0.0  # time inside the step's interval that is no step's: a pause, a switch, the epoch's test

    @property
    def images_per_s(self) -> float:
        return self.batch_size / self.iter_s if self.iter_s > 0 else 0.0


@dataclass(frozen=True)
class Span:
    """One interval inside a step, relative to the step's start."""

    kind: str  # one of SPAN_KINDS
    name: str  # layer name ("features.0"), collective ("allreduce features.0.weight", "bucket 3")
    start_s: float
    dur_s: float
    nbytes: int = 0
    tx_bytes: int = 0
    rx_bytes: int = 0

    @property
    def end_s(self) -> float:
        return self.start_s + self.dur_s


@dataclass(frozen=True)
class StepSpans(Event):
    """All spans of one sampled step of one rank."""

    kind: ClassVar[str] = "step_spans"
    rank: int
    step: int
    segment: int
    t0: float  # wall clock at the step's start
    spans: tuple[Span, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        out = super().to_dict()
        # compact: one list per span instead of a dict per span (a VGG step has ~100 spans)
        out["spans"] = [[s.kind, s.name, s.start_s, s.dur_s, s.nbytes, s.tx_bytes, s.rx_bytes] for s in self.spans]
        return out


@dataclass(frozen=True)
class NicStat:
    """One network interface, like the `slurm` monitor: rates in bytes/s, totals since the run started."""

    iface: str
    rx_rate: float
    tx_rate: float
    rx_bytes: int
    tx_bytes: int
    rx_packets: int
    tx_packets: int
    rx_errors: int
    tx_errors: int
    rx_drops: int
    tx_drops: int
    peak_rx_rate: float
    peak_tx_rate: float


@dataclass(frozen=True)
class GpuStat:
    """One GPU a rank trains on, through NVML. None: the device does not report that metric (MIG slices, some
    boards), or a rate has no previous reading yet. Fields after temp_c came later: older recordings read None."""

    index: int  # nvidia-smi's index of the physical GPU
    name: str
    util_percent: float | None  # share of the last sample period in which a kernel ran ("volatile GPU-util")
    mem_used_bytes: int | None  # the whole GPU, every process
    mem_total_bytes: int | None
    power_w: float | None
    temp_c: float | None
    sm_clock_mhz: float | None = None
    pcie_rx_bytes_s: float | None = None  # NVML's PCIe throughput, a 20 ms window
    pcie_tx_bytes_s: float | None = None
    nvlink_rx_bytes_s: float | None = None  # data over every NVLink of the GPU; None without NVLink
    nvlink_tx_bytes_s: float | None = None
    proc_mem_bytes: int | None = None  # this rank's process alone (context and allocator), as NVML counts it
    uuid: str = ""


@dataclass(frozen=True)
class SystemSample(Event):
    """One reading of the node and process a rank runs on."""

    kind: ClassVar[str] = "system_sample"
    rank: int
    host: str
    t: float
    proc_cpu_percent: float
    node_cpu_percent: float
    proc_rss_bytes: int
    node_mem_used_bytes: int
    node_mem_total_bytes: int
    job_iface: str  # the interface that carries the job's traffic
    nics: tuple[NicStat, ...] = ()
    gpus: tuple[GpuStat, ...] = ()
    gpu_status: str = "not available"  # "ok" or why there is no GPU reading

    def nic(self, iface: str | None = None) -> NicStat | None:
        name = iface or self.job_iface
        return next((n for n in self.nics if n.iface == name), None)


@dataclass(frozen=True)
class EpochDone(Event):
    """Test-set evaluation at the end of an epoch (this rank's shard of the test set)."""

    kind: ClassVar[str] = "epoch_done"
    rank: int
    epoch: int
    step: int
    test_loss: float
    correct: int
    total: int
    t: float


@dataclass(frozen=True)
class RunFinished(Event):
    kind: ClassVar[str] = "run_finished"
    rank: int
    steps: int
    reason: str  # "done", "stopped", "error: ..."
    t: float
    fingerprint: str = ""  # SHA-256 of the final parameters (see ddptop.train.fingerprint)


@dataclass(frozen=True)
class LogLine(Event):
    """A line a rank wants the user to see (warnings, refused control messages)."""

    kind: ClassVar[str] = "log"
    rank: int  # FRONT: ddptop's own front (the collector), not a rank
    level: str
    message: str
    t: float

    @property
    def who(self) -> str:
        return "ddptop" if self.rank == FRONT else f"rank {self.rank}"


# -- control events -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class ConfigApplied(Event):
    """A rank switched to a new sync configuration at `step`; every later event carries `segment`."""

    kind: ClassVar[str] = "config_applied"
    rank: int
    step: int
    segment: int
    config: dict
    request_id: int
    who: str
    t: float
    fingerprint: str = ""  # SHA-256 of this rank's parameters as the segment starts
    sync_bytes: int = 0  # one-off: bytes broadcast from rank 0 to re-synchronize the ranks at this switch
    switch_s: float = 0.0  # one-off: time the switch took on this rank (rebuild, broadcast, fingerprint)
    steps_per_epoch: int = 0  # at this segment's batch size (older files: 0, unknown)


@dataclass(frozen=True)
class OutOfMemory(Event):
    """A batch that did not fit: the trial step after the batch grew ran out of GPU memory on `ranks`, and every
    rank went back to batch `back_to` at `step` (0: the run stopped there, a sweep that grows until it does not fit)."""

    kind: ClassVar[str] = "out_of_memory"
    rank: int  # the rank reporting it (rank 0; every rank acts alike)
    step: int
    segment: int  # the segment whose batch did not fit
    batch_size: int
    back_to: int
    ranks: tuple  # ranks that ran out of memory
    t: float

    def __post_init__(self) -> None:  # JSON brings a list
        if not isinstance(self.ranks, (list, tuple)) or not all(isinstance(r, int) for r in self.ranks):
            raise TypeError("ranks must be a list of whole numbers")
        object.__setattr__(self, "ranks", tuple(self.ranks))

    def describe(self) -> str:
        who = f"rank{'s' if len(self.ranks) != 1 else ''} {', '.join(map(str, self.ranks))}"
        then = f"back to batch {self.back_to}" if self.back_to else "the sweep stops growing the batch here"
        return f"batch {self.batch_size} does not fit (CUDA out of memory on {who}): {then}"


@dataclass(frozen=True)
class ModelsDiverged(Event):
    """The front saw ranks report different model fingerprints where every rank must hold the same model."""

    kind: ClassVar[str] = "models_diverged"
    segment: int
    step: int
    where: str  # "segment start" or "end of run"
    fingerprints: dict  # rank (as text) → fingerprint
    t: float

    def describe(self) -> str:
        groups: dict[str, list[str]] = {}
        for rank, fp in sorted(self.fingerprints.items(), key=lambda kv: int(kv[0]) if str(kv[0]).isdigit() else 0):
            groups.setdefault(str(fp), []).append(str(rank))
        parts = [f"ranks {', '.join(r)}: {fp[:12]}" for fp, r in groups.items()]
        return f"models differ at the {self.where} of segment {self.segment} (step {self.step}): {'; '.join(parts)}"


@dataclass(frozen=True)
class ControlRefused(Event):
    """Rank 0 ignored a control message: bad MAC, malformed, or a value out of range."""

    kind: ClassVar[str] = "control_refused"
    request_id: int
    reason: str
    t: float


@dataclass(frozen=True)
class RankLost(Event):
    """The front stopped hearing from a rank: its heartbeat went stale or its process ended badly."""

    kind: ClassVar[str] = "rank_lost"
    rank: int
    last_step: int
    reason: str
    t: float


@dataclass(frozen=True)
class RunState(Event):
    """Pause and resume as every rank saw them, at a step boundary."""

    kind: ClassVar[str] = "run_state"
    rank: int
    step: int
    paused: bool
    t: float


@dataclass(frozen=True)
class RankBack(Event):
    """A rank marked lost is heard from again (a valid heartbeat after SIGSTOP/SIGCONT, a network that came back)."""

    kind: ClassVar[str] = "rank_back"
    rank: int
    step: int
    silent_s: float  # how long nothing valid came from it
    t: float


@dataclass(frozen=True)
class TelemetryGap(Event):
    """Telemetry batches of a rank that the front never received or refused: the loss is stated, never silent."""

    kind: ClassVar[str] = "telemetry_gap"
    rank: int
    first_seq: int
    last_seq: int
    reason: str  # "the collector fell behind", "missing from the store", "bad MAC", ...
    t: float


@dataclass(frozen=True)
class RecorderFailed(Event):
    """The recording stopped (disk full, I/O error): training goes on unless --record-required."""

    kind: ClassVar[str] = "recorder_failed"
    path: str
    reason: str
    required: bool
    t: float


@dataclass(frozen=True)
class StoreFlooded(Event):
    """The store holds more keys than the job ever writes: someone else on its port is filling it."""

    kind: ClassVar[str] = "store_flooded"
    keys: int
    expected: int
    t: float


EVENT_TYPES: dict[str, type[Event]] = {
    cls.kind: cls for cls in (RankJoined, RunStarted, StepDone, StepSpans, SystemSample, EpochDone, RunFinished, LogLine,
                              ConfigApplied, ControlRefused, RankLost, RunState, RankBack, TelemetryGap,
                              RecorderFailed, StoreFlooded, ModelsDiverged, OutOfMemory)
}


class EventDecodeError(ValueError):
    pass


def event_from_dict(data: Any) -> Event:
    """Build an event from decoded JSON; unknown fields are ignored, unknown kinds and newer versions refused."""
    if not isinstance(data, dict):
        raise EventDecodeError("event is not an object")
    kind, version = data.get("kind"), data.get("v")
    cls = EVENT_TYPES.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise EventDecodeError(f"unknown event kind {kind!r}")
    if not isinstance(version, int) or version > SCHEMA_VERSION:
        raise EventDecodeError(f"event schema {version!r} is newer than this ddptop's ({SCHEMA_VERSION})")
    kwargs = {}
    try:
        for f in dataclasses.fields(cls):
            if f.name in data:
                kwargs[f.name] = clean_value(data[f.name])  # strings come from anyone: never raw to a terminal
        if cls is StepSpans:
            kwargs["spans"] = tuple(Span(*s) for s in kwargs.get("spans", ()))
        elif cls is SystemSample:
            kwargs["nics"] = tuple(NicStat(**n) for n in kwargs.get("nics", ()))
            kwargs["gpus"] = tuple(GpuStat(**g) for g in kwargs.get("gpus", ()))
        elif cls is RunStarted:
            kwargs["layers"] = tuple(tuple(x) for x in kwargs.get("layers", ()))
        return cls(**kwargs)
    except (TypeError, ValueError) as exc:
        raise EventDecodeError(f"bad {kind} event: {exc}") from None


def encode_events(events: list[Event]) -> bytes:
    return json.dumps([e.to_dict() for e in events], separators=(",", ":")).encode()


def decode_events(blob: bytes, max_bytes: int = 64 * MAX_EVENT_BYTES) -> list[Event]:
    if len(blob) > max_bytes:
        raise EventDecodeError(f"event batch of {len(blob)} bytes is over the {max_bytes}-byte cap")
    try:
        items = json.loads(blob)
    except (ValueError, RecursionError) as exc:
        raise EventDecodeError(f"event batch is not JSON: {exc}") from None
    if not isinstance(items, list):
        raise EventDecodeError("event batch is not a list")
    return [event_from_dict(item) for item in items]


class Source(Protocol):
    """Anything that yields events: a live job or a recording. The UI cannot tell them apart."""

    def poll(self) -> list[Event]:
        """Events that arrived since the last call (never blocks for long)."""
        ...

    def close(self) -> None: ...
