"""The event vocabulary: small frozen dataclasses that travel as JSON between ranks, files and screens.

Events carry plain numbers and strings, never tensors. `to_dict`/`event_from_dict` are the encoding, and a rank's
StepDone also travels as a fixed binary record (`encode_steps`/`decode_steps`); nothing is ever pickled, since the
store and recordings can come from anyone.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import operator
import os
import struct
import types
import typing
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

from ddptop.safe import clean, clean_value

SCHEMA_VERSION = 1
FRONT = -1  # the rank of a LogLine the front itself says
MAX_EVENT_BYTES = 1 << 20  # one decoded event may not exceed 1 MiB: values come from the network
MAX_TEXT = 1 << 16  # characters in one text field: ddptop's longest (a LogLine with a traceback) is far shorter
MAX_INT = (1 << 63) - 1  # SQLite's INTEGER: a larger whole number could not be recorded
SIGNED = frozenset({"request_id", "last_step"})  # may be negative: a counter someone broke; -1 is "no step reported"
NOT_FINITE = frozenset({"loss", "test_loss"})  # a diverged model's loss is NaN or inf, and is shown as such

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

    def to_wire(self) -> list[Any]:
        """The event as a rank sends it: [kind, schema, each field's value in field order]. No key names: a front
        that decodes 1,024 ranks' telemetry spent a third of its parse on them (issue 41). Fields are only ever
        added at the end, so an older front reads a newer rank's list as far as it knows the fields."""
        if type(self).to_dict is not Event.to_dict:  # a kind with its own compact form (StepSpans)
            return [*self.to_dict().values()]
        values = self.__dict__
        return [self.kind, SCHEMA_VERSION, *(v if type(v) in _SCALARS else _plain(v)
                                             for v in map(values.__getitem__, _names(type(self))))]


_SCALARS = frozenset({int, float, str, bool, type(None)})


@functools.lru_cache(maxsize=None)
def _names(cls: type) -> tuple[str, ...]:
    """The fields of `cls` in order, once per class: dataclasses.fields and a _plain per value made a StepDone's
    to_wire 60 µs, most of a rank's publisher per step (issue 42)."""
    return tuple(f.name for f in dataclasses.fields(cls))


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
    layers: tuple[tuple[str, int], ...]  # ((layer name, parameter count), ...)
    steps_per_epoch: int
    t: float
    total_steps: int = 0  # added after schema 1 shipped: older files decode with 0 ("unknown")
    sweep_segments: int = 0  # a profile's sweep: how many configurations it runs one after another
    warmup: int = 1  # steps at each segment's start left out of its figures (metrics.warmup_for)
    accum: int = 1  # segment 0's micro-steps per step (older files: 1); steps_per_epoch counts steps
    param_shapes: tuple[tuple[int, ...], ...] = ()  # each gradient's shape (PowerSGD's bytes; older files: ())
    backend: str = ""  # torch.distributed's backend, "gloo" or "nccl" (their collectives move different bytes; older: "")
    no_eval: str = ""  # why the run evaluates no test accuracy ("": it does, at each epoch's end; older files: "")


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
    # added after schema 1 shipped (older files decode with 0): compute_s = micro_s + fwd_s + bwd_s + opt_s
    fwd_s: float = 0.0
    bwd_s: float = 0.0
    opt_s: float = 0.0
    own_s: float = 0.0  # time the training thread spent in ddptop's own code during this step
    # added later still (older files and ranks: 0, their steps then seem to start after any pause inside them)
    aside_s: float = 0.0  # time inside the step's interval that is no step's: a pause, a switch, the epoch's test
    # added with the micro-step part (older files and ranks: 0, their micro-steps inside fwd_s as before)
    micro_s: float = 0.0  # accum K > 1: the K−1 unsynchronized micro-steps (each one's forward, backward and the
    #                       next batch's loading), carved out of fwd_s, which keeps the synchronized one's forward
    # added with token counting (older files and ranks: 0, no count): the tokens the step trained, where its batches
    # say how many (a dict batch's `attention_mask` summed, or the user's own `tokens` callable: train/batches.tokens)
    tokens: int = 0
    # added with issue 42 (older files and ranks: 0, not measured)
    threads_s: float = 0.0  # CPU time ddptop's other threads on this rank (publisher, sampler, control, ZeroMQ's
    #                         I/O) spent per step: the mean over the steps between two readings, about 1 s apart
    # no rate of its own: img/s is a window's images over its time (metrics.rate); an `images_per_s` key that a
    # rank or file may hold is ignored like any unknown field


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
    # the interface's known rate (bits/s, each way) and who says so: LINK_BY when `ddptop lab` shaped the link,
    # else NIC_BY (the kernel's link speed); None: unknown. Recordings from before these fields read None.
    speed_bits_per_s: float | None = None
    speed_by: str = ""

    def __post_init__(self) -> None:
        if self.speed_bits_per_s is not None and not (math.isfinite(self.speed_bits_per_s) and self.speed_bits_per_s > 0):
            raise EventDecodeError(f"a NIC speed must be positive, found {self.speed_bits_per_s!r}")


LINK_ENV = "DDPTOP_LAB_LINK_BITS"  # `ddptop lab` gives its jobs the rate it shaped each link to (bits/s, each way)
LINK_BY = "shaped by ddptop lab"
NIC_BY = "reported by the NIC"


def link_bits() -> float | None:
    """The rate `ddptop lab` shaped this job's link to, from LINK_ENV; None outside the lab or when unreadable."""
    try:
        bits = float(os.environ.get(LINK_ENV, ""))
    except ValueError:
        return None
    return bits if math.isfinite(bits) and bits > 0 else None


CPUS_ENV = "DDPTOP_LAB_CPUS"  # the CPU quota (cores) of each `ddptop lab` node, which its jobs cannot read there


def lab_cpus() -> float | None:
    """The lab node's CPU quota from CPUS_ENV; None outside the lab, without a quota, or when unreadable."""
    try:
        cores = float(os.environ.get(CPUS_ENV, ""))
    except ValueError:
        return None
    return cores if math.isfinite(cores) and cores > 0 else None


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
    # NVML's total-energy counter (nvmlDeviceGetTotalEnergyConsumption, mJ since the driver loaded) in joules; None
    # before Volta, on MIG slices, and in recordings from before it (metrics.energy: power × time then)
    energy_j: float | None = None


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
    # cores of the CPU quota of the cgroup the rank runs in (a `ddptop lab` node): node_cpu_percent is then that
    # cgroup's CPU time as a share of its quota; None: the whole machine's CPU, as psutil reads it
    node_cpu_quota: float | None = None

    def __post_init__(self) -> None:
        if self.node_cpu_quota is not None and not (math.isfinite(self.node_cpu_quota) and self.node_cpu_quota > 0):
            raise EventDecodeError(f"a CPU quota must be positive, found {self.node_cpu_quota!r}")

    def nic(self, iface: str | None = None) -> NicStat | None:
        name = iface or self.job_iface
        return next((n for n in self.nics if n.iface == name), None)


MEMORY_BY = ("cuda allocator", "process USS", "process statm")  # who measured MemorySample.peak_bytes/now_bytes


@dataclass(frozen=True)
class MemorySample(Event):
    """What one rank holds at the end of a step, by kind (issue 43): the bytes of its own storage of parameters,
    gradients and optimizer state (a sharded strategy's shard, not the gathered whole; each storage once), and the
    device's memory: the peak since the rank's previous sample and the value at this step's end. Taken on a cadence
    (probes.memory), not every step; `cost_s` is what taking it cost the training thread (part of own_s)."""

    kind: ClassVar[str] = "memory_sample"
    rank: int
    step: int
    segment: int
    t: float
    param_bytes: int
    grad_bytes: int
    optim_bytes: int
    peak_bytes: int  # cuda: max_memory_allocated since the previous sample; cpu: now_bytes (read once, at the end)
    now_bytes: int  # cuda: memory_allocated at this step's end; cpu: the process's unique memory (USS) there
    reserved_bytes: int  # cuda: memory_reserved (the allocator's cache and what it holds); cpu: 0
    by: str  # one of MEMORY_BY: what measured peak_bytes and now_bytes
    cost_s: float = 0.0

    def __post_init__(self) -> None:
        if self.by not in MEMORY_BY:
            raise EventDecodeError(f"a memory sample's `by` must be one of {', '.join(MEMORY_BY)}")


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


@dataclass(frozen=True)
class ClockSync(Event):
    """Rank 0's ping-pong with every rank over the process group, at the run's start and end: each rank's wall clock
    minus rank 0's, from the exchange with the shortest round trip, true within ±rtt/2 (metrics.stragglers)."""

    kind: ClassVar[str] = "clock_sync"
    rank: int  # the rank that measured: 0
    at: str  # "start" or "end"
    t: float  # rank 0's wall clock when it measured
    peers: tuple[tuple[int, float, float], ...]  # (rank, offset_s, rtt_s) for every rank, rank 0's own (0, 0, 0)


# -- control events -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class ConfigApplied(Event):
    """A rank switched to a new sync configuration at `step`; every later event carries `segment`."""

    kind: ClassVar[str] = "config_applied"
    rank: int
    step: int
    segment: int
    config: dict[str, Any]  # config.SyncConfig's fields, typed as it types them
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
    ranks: tuple[int, ...]  # ranks that ran out of memory
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
    fingerprints: dict[str, str]  # rank (as text) → fingerprint
    t: float

    def describe(self) -> str:
        groups: dict[str, list[str]] = {}
        for rank, fp in sorted(self.fingerprints.items(), key=lambda kv: int(kv[0]) if str(kv[0]).isdigit() else 0):
            groups.setdefault(str(fp), []).append(str(rank))
        parts = [f"ranks {', '.join(r)}: {fp[:12]}" for fp, r in groups.items()]
        return f"models differ at the {self.where} of segment {self.segment} (step {self.step}): {'; '.join(parts)}"


@dataclass(frozen=True)
class ControlRefused(Event):
    """Rank 0 ignored a control message: stale, replayed, malformed, or a value out of range."""

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


@dataclass(frozen=True)
class EventsRefused(Event):
    """Events of one telemetry batch that failed the typed decoding (a field of the wrong type or out of range) or
    claimed another rank than the batch's: each refused alone, never applied nor recorded, and counted here."""

    kind: ClassVar[str] = "events_refused"
    rank: int  # the rank whose batch held them
    seq: int  # that batch
    count: int
    reason: str  # the first one's
    t: float


TUNABLE = ("bucket", "strategy")  # what `--tune` and `ctl tune` tune: DDP's (and zero1's) buckets, or the strategy


def _tunable(what: str) -> None:
    if what not in TUNABLE:
        raise EventDecodeError(f"a tune's `what` must be one of {', '.join(TUNABLE)}")


@dataclass(frozen=True)
class TuneAsked(Event):
    """Rank 0 accepted `ddptop ctl tune bucket|strategy` (request `request_id`): the front's tuner takes it from
    here."""

    kind: ClassVar[str] = "tune_asked"
    rank: int
    request_id: int
    who: str
    t: float
    what: str = "bucket"  # one of TUNABLE; older files and ranks asked for buckets only

    def __post_init__(self) -> None:
        _tunable(self.what)


@dataclass(frozen=True)
class TuneTrial:
    """One configuration a tune measured (a bucket size, or a strategy): the slowest rank's mean step over steps
    first..last of `segment`; for a strategy, also what the rank holding most held and the largest peak (metrics.memory:
    each rank's newest sample of the segment when the steps were measured)."""

    segment: int
    bucket_mb: float
    first_step: int
    last_step: int
    step_s: float
    step_se_s: float = 0.0  # step_s's standard error (metrics.Figures.step_se_s); 0 in older files
    strategy: str = ""  # the segment's strategy ("" in older files: a bucket tune's trials all ran ddp)
    held_bytes: int = 0  # parameters + gradients + optimizer state of the rank holding most; 0: not measured
    peak_bytes: int = 0  # the largest rank's peak memory over the segment's samples so far

    def ms(self) -> str:
        spread = f"±{self.step_se_s * 1e3:.1f}" if self.step_se_s else ""
        return f"{self.step_s * 1e3:.1f}{spread} ms"

    def said(self) -> str:
        """A strategy trial as the note lists it: its step and memory per rank."""
        return f"{self.strategy} {self.ms()}, held {self.held_bytes / 1e6:.1f} MB, peak {self.peak_bytes / 1e6:.1f} MB"


# fields renamed after recordings held them: (class, name now) → the name older files and ranks wrote
OLD_NAMES = {(TuneTrial, "step_se_s"): "spread_s"}


@dataclass(frozen=True)
class TuneNote(Event):
    """A tune's outcome, said by the front: the starting configuration, each trial, the one kept and the gain against
    the start (start − kept, s/step; 0 when the start was kept). `kept_mb` (bucket) or `kept_strategy` (strategy)
    empty: the tune stopped (`reason` says why)."""

    kind: ClassVar[str] = "tune_note"
    request_id: int  # the ctl request that asked for it; 0: --tune
    start: TuneTrial
    trials: tuple[TuneTrial, ...]
    kept_mb: float
    gain_s: float
    reason: str
    t: float
    what: str = "bucket"  # one of TUNABLE
    kept_strategy: str = ""  # a strategy tune's kept strategy

    def __post_init__(self) -> None:
        _tunable(self.what)

    @property
    def kept(self) -> bool:
        """The tune ended with a configuration kept (else it stopped)."""
        return bool(self.kept_strategy if self.what == "strategy" else self.kept_mb)

    def describe(self) -> str:
        if not self.kept:
            return f"tune {self.what} stopped after {len(self.trials)} trials: {self.reason}"
        if self.what == "strategy":
            tried = "; ".join(x.said() for x in (self.start, *self.trials))
            if self.kept_strategy == self.start.strategy:
                return (f"tune strategy: kept {self.kept_strategy}: no other strategy was faster by more than the "
                        f"noise of its measurement; per rank: {tried}")
            share = self.gain_s / self.start.step_s if self.start.step_s > 0 else 0.0
            return (f"tune strategy: kept {self.kept_strategy}, {-self.gain_s * 1e3:+.1f} ms/step ({-share:+.1%}) "
                    f"against {self.start.strategy}; per rank: {tried}")
        tried = ", ".join(f"{x.bucket_mb:g} MB {x.ms()}" for x in self.trials)
        if self.kept_mb == self.start.bucket_mb:
            return (f"tune bucket: kept {self.kept_mb:g} MB ({self.start.ms()}): no other size was "
                    f"faster by more than the noise of its measurement; tried {tried}")
        share = self.gain_s / self.start.step_s if self.start.step_s > 0 else 0.0
        return (f"tune bucket: kept {self.kept_mb:g} MB, {-self.gain_s * 1e3:+.1f} ms/step ({-share:+.1%}) against "
                f"{self.start.bucket_mb:g} MB ({self.start.ms()}); tried {tried}")


@dataclass(frozen=True)
class RankShifted(Event):
    """The front saw one rank's busy time per step (step time less exposed communication) shift at `step` and stay
    shifted, beyond its own noise and unlike the other ranks' over the same steps (metrics.changes): once per shift."""

    kind: ClassVar[str] = "rank_shifted"
    rank: int
    segment: int
    step: int  # the first step at the new level
    before_s: float  # the rank's median busy time a step before `step`
    after_s: float  # and from `step` on
    others_before_s: float  # the other ranks' median over the same steps
    others_after_s: float
    steps: int  # measured steps at the new level when it was named
    t: float

    def describe(self) -> str:
        ratio = self.after_s / self.before_s if self.before_s > 0 else 0.0
        way = "slower" if self.after_s > self.before_s else "faster"
        return (f"step {self.step}: rank {self.rank} became {way}: busy {self.before_s * 1e3:.1f} → "
                f"{self.after_s * 1e3:.1f} ms a step ({(self.after_s - self.before_s) * 1e3:+.1f} ms, ×{ratio:.2f}) "
                f"and stayed so; the other ranks' {self.others_before_s * 1e3:.1f} → {self.others_after_s * 1e3:.1f} "
                f"ms (segment {self.segment})")


@dataclass(frozen=True)
class FrontCost(Event):
    """The CPU time the front's own process (rank 0's host: collector, recorder, screen) spent, as the kernel counted
    it, over the job steps finished since its last reading: ddptop's cost per step beyond each rank's own_s and
    threads_s (issue 42). A reading every few seconds while steps advance, never per step."""

    kind: ClassVar[str] = "front_cost"
    cpu_s: float  # the front process's user + system CPU time over the interval, all its threads
    steps: int  # job steps finished in the interval: the newest step any rank finished, less the last reading's
    step: int  # the newest step any rank finished at this reading
    t: float

    def __post_init__(self) -> None:
        if self.steps < 1:
            raise EventDecodeError(f"a front cost covers at least one step, found {self.steps!r}")
        if self.cpu_s < 0:
            raise EventDecodeError(f"a front's CPU time cannot be negative, found {self.cpu_s!r}")


EVENT_TYPES: dict[str, type[Event]] = {
    cls.kind: cls for cls in (RankJoined, RunStarted, StepDone, StepSpans, SystemSample, EpochDone, RunFinished, LogLine,
                              ConfigApplied, ControlRefused, RankLost, RunState, RankBack, TelemetryGap,
                              RecorderFailed, StoreFlooded, ModelsDiverged, OutOfMemory, EventsRefused,
                              ClockSync, TuneAsked, TuneNote, MemorySample, RankShifted, FrontCost)
}


class EventDecodeError(ValueError):
    pass


def event_from_dict(data: Any) -> Event:
    """Build an event from decoded JSON, every field checked against its annotation (see `_check`); unknown
    fields are ignored, unknown kinds and newer versions refused."""
    if type(data) is list:  # Event.to_wire's form
        return _from_wire(data)
    if not isinstance(data, dict):
        raise EventDecodeError("event is not an object")
    kind, version = data.get("kind"), data.get("v")
    cls = EVENT_TYPES.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise EventDecodeError(f"unknown event kind {kind!r}")
    if not isinstance(version, int) or version > SCHEMA_VERSION:
        raise EventDecodeError(f"event schema {version!r} is newer than this ddptop's ({SCHEMA_VERSION})")
    try:
        return _record(cls, data, "")
    except (TypeError, ValueError, OverflowError, RecursionError) as exc:
        raise EventDecodeError(f"bad {kind} event: {exc}") from None


def _from_wire(data: list) -> Event:
    """An event in Event.to_wire's form, every field checked as event_from_dict checks it; items past the fields
    this ddptop knows (a newer rank's) are ignored, as unknown keys are."""
    kind, version = (data[0], data[1]) if len(data) >= 2 else (None, None)
    cls = EVENT_TYPES.get(kind) if type(kind) is str else None
    if cls is None:
        raise EventDecodeError(f"unknown event kind {kind!r}")
    if type(version) is not int or version > SCHEMA_VERSION:
        raise EventDecodeError(f"event schema {version!r} is newer than this ddptop's ({SCHEMA_VERSION})")
    plan = _plan(cls)
    try:
        if cls is LogLine:  # its rank may be FRONT's, as in an object (_record)
            return _record(cls, dict(zip((name for name, _, _ in plan), data[2:])), "")
        kwargs = {name: check(value, name) for (name, _, check), value in zip(plan, data[2:])}
        if len(kwargs) == len(plan) and _plain_init(cls):
            return _build(cls, kwargs)
        return cls(**kwargs)
    except (TypeError, ValueError, OverflowError, RecursionError) as exc:
        raise EventDecodeError(f"bad {kind} event: {exc}") from None


# -- typed decoding: what JSON from the store or a file holds is checked field by field against the annotations --

@functools.lru_cache(maxsize=None)
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


@functools.lru_cache(maxsize=None)
def _plan(cls: type) -> tuple[tuple[str, str, Any], ...]:
    """Each field of `cls` once: (its name, the older name a file may hold it under, the function that checks it).
    Worked out once per class, not per value: the front decodes every rank's every event (issue 41: 1,024 ranks)."""
    hints, out = _hints(cls), []
    for f in dataclasses.fields(cls):
        if (cls, f.name) == (ConfigApplied, "config"):
            check = _config
        else:
            check = _FAST.get(hints[f.name], functools.partial(_check, hints[f.name]))
            if hints[f.name] is int and f.name in SIGNED:
                check = functools.partial(_check, int)
        out.append((f.name, OLD_NAMES.get((cls, f.name), f.name), check))
    return tuple(out)


@functools.lru_cache(maxsize=None)
def _plain_init(cls: type) -> bool:
    """Whether a checked record of `cls` may be built by `_build`: it has no __post_init__ to run."""
    return not hasattr(cls, "__post_init__")


def _build(cls: type, fields: dict[str, Any]) -> Any:
    """`cls(**fields)` for fields already checked, all of them given, and `_plain_init(cls)`: the same object (equal,
    same hash), without a frozen dataclass's object.__setattr__ per field (2.5 µs of a 7-field span, 6 µs of a
    StepDone here: most of what the front spends decoding, issue 41)."""
    made = _new(cls)
    made.__dict__.update(fields)
    return made


def _fast_int(value: Any, where: str) -> Any:
    """An unsigned int field: the common case in one test, else the generic check says what is wrong."""
    return value if type(value) is int and 0 <= value <= MAX_INT else _check(int, value, where)


def _fast_float(value: Any, where: str) -> Any:
    return value if type(value) is float and math.isfinite(value) else _check(float, value, where)


def _fast_str(value: Any, where: str) -> Any:
    return _clean_text(value) if type(value) is str and len(value) <= MAX_TEXT else _check(str, value, where)


def _fast_bool(value: Any, where: str) -> Any:
    return value if type(value) is bool else _check(bool, value, where)


_FAST = {int: _fast_int, float: _fast_float, str: _fast_str, bool: _fast_bool}


@functools.lru_cache(maxsize=4096)
def _clean_text(text: str) -> str:
    """A text field cleaned (safe.clean_value); the same names (layers, hosts, kinds) come in every batch."""
    return clean_value(text)


def _record(cls: type, value: Any, where: str) -> Any:
    """A dataclass from a JSON object (or, for a span, a list in field order); a missing required field is a
    TypeError from the constructor."""
    plan = _plan(cls)
    if type(value) is list and cls is Span and len(value) <= len(plan):  # StepSpans.to_dict's compact form
        value = dict(zip((name for name, _, _ in plan), value))
    if type(value) is not dict:
        raise EventDecodeError(f"{where or cls.__name__} is not an object")
    prefix = f"{where}." if where else ""
    kwargs = {}
    for name, old, check in plan:
        held = name if name in value else old
        if held not in value:
            continue
        if cls is LogLine and name == "rank" and value[held] == FRONT:
            kwargs[name] = FRONT  # the front's own line (the collector failed); a rank's batch cannot claim it
        else:
            kwargs[name] = check(value[held], prefix + held)
    if len(kwargs) == len(plan) and _plain_init(cls):  # every field held and checked: no default to fill
        return _build(cls, kwargs)
    try:
        return cls(**kwargs)
    except TypeError as exc:  # a field missing: a nested record (a tune's trial) says which field held it
        if not where:
            raise
        raise EventDecodeError(f"{where}: {exc}") from None


def _check(tp: Any, value: Any, where: str) -> Any:
    """`value` as annotation `tp` says: ints are ints (not bools) in SQLite's range and ≥ 0 unless SIGNED, floats
    finite (ints accepted; NaN and inf only for a loss), text is text of at most MAX_TEXT characters (cleaned),
    containers hold what their annotation says. Anything else is an EventDecodeError naming the field."""
    name = where.rpartition(".")[2]
    if tp is bool or tp is int or tp is float or tp is str:
        return _scalar(tp, value, where, name)
    if dataclasses.is_dataclass(tp):
        return _record(tp, value, where)
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (types.UnionType, typing.Union):  # X | None: None, or an X
        if value is None and type(None) in args:
            return None
        return _check(next(a for a in args if a is not type(None)), value, where)
    if origin is tuple:
        if type(value) not in (list, tuple) or (args[-1] is not Ellipsis and len(value) != len(args)):
            raise EventDecodeError(f"{where}: expected a list of {len(args) if args[-1] is not Ellipsis else 'any'}"
                                   f" items, found {_what(value)}")
        if args[0] is Span and args[-1] is Ellipsis:
            fast = [_plain_span(v) for v in value]
            if not any(span is None for span in fast):  # `None in fast` would call each Span's __eq__
                return tuple(fast)
        kinds = [args[0]] * len(value) if args[-1] is Ellipsis else args
        return tuple(_check(k, v, f"{where}[{i}]") for i, (k, v) in enumerate(zip(kinds, value)))
    if origin is dict:
        if type(value) is not dict:
            raise EventDecodeError(f"{where}: expected an object, found {_what(value)}")
        out = {}
        for key, item in value.items():
            key = _check(args[0], key, f"{where} key")
            out[key] = _check(args[1], item, f"{where}[{clean(key, 40)!r}]")  # [...]: a key never reads as a field
        return out
    if tp is Any:  # a plain value: no containers where the annotation does not say what they hold
        if value is None:
            return None
        return _scalar(type(value), value, where, name) if type(value) in (bool, int, float, str) else _refuse(
            where, "a plain value", value)
    raise EventDecodeError(f"{where}: no check for {tp!r}")  # a new annotation needs one here


def _plain_span(value: Any, _finite=math.isfinite, _str=str, _float=float, _int=int) -> Span | None:
    """A span in its compact form whose every item already has its exact type and range, built directly; else None,
    and the generic check names what is wrong. A sampled step holds ~100 spans: checked one field at a time they
    were 80% of what the front spent decoding a rank's second of telemetry (3.9 ms; issue 41's 1,024 ranks); the
    seven-item form (what a Publisher sends) is checked without a loop (4.4 → 1.9 µs a span here)."""
    if type(value) is not list:
        return None
    n = len(value)
    if n == 7:
        kind, name, start, dur, nbytes, tx, rx = value
        if not (type(nbytes) is _int and type(tx) is _int and type(rx) is _int
                and 0 <= nbytes <= MAX_INT and 0 <= tx <= MAX_INT and 0 <= rx <= MAX_INT):
            return None
    elif 4 <= n < 7:
        kind, name, start, dur, *counts = value
        if not all(type(c) is _int and 0 <= c <= MAX_INT for c in counts):
            return None
        nbytes, tx, rx = (*counts, 0, 0, 0)[:3]  # Span's defaults
    else:
        return None
    if (type(kind) is _str and type(name) is _str and len(kind) <= MAX_TEXT and len(name) <= MAX_TEXT
            and type(start) is _float and type(dur) is _float and _finite(start) and _finite(dur)):
        return _build(Span, {"kind": _clean_text(kind), "name": _clean_text(name), "start_s": start, "dur_s": dur,
                             "nbytes": nbytes, "tx_bytes": tx, "rx_bytes": rx})
    return None


_new = object.__new__


def _scalar(tp: type, value: Any, where: str, name: str) -> Any:
    if tp is bool:
        return value if type(value) is bool else _refuse(where, "true or false", value)
    if tp is int:
        low = -MAX_INT if name in SIGNED else 0
        return value if type(value) is int and low <= value <= MAX_INT else _refuse(
            where, f"a whole number in {low}..2^63-1", value)
    if tp is float:
        if type(value) not in (int, float):
            return _refuse(where, "a number", value)
        try:
            number = float(value)
        except OverflowError:  # a whole number past 1e308
            return _refuse(where, "a finite number", value)
        return number if math.isfinite(number) or name in NOT_FINITE else _refuse(where, "a finite number", value)
    if type(value) is not str or len(value) > MAX_TEXT:
        return _refuse(where, f"text of at most {MAX_TEXT} characters", value)
    return clean_value(value)  # strings come from anyone: never raw to a terminal


def _refuse(where: str, wanted: str, value: Any) -> Any:
    raise EventDecodeError(f"{where}: expected {wanted}, found {_what(value)}")


def _what(value: Any) -> str:
    """A refused value described without repeating text someone else chose."""
    if type(value) in (int, float):
        return repr(value) if len(repr(value)) <= 24 else f"a {len(str(value))}-digit {type(value).__name__}"
    if type(value) is str:
        return f"text of {len(value)} characters"
    return "null" if value is None else type(value).__name__


def _config(value: Any, where: str) -> dict[str, Any]:
    """A ConfigApplied's config: SyncConfig's fields typed as SyncConfig types them, other keys plain values."""
    from ddptop.config import SyncConfig  # events sits below config in the imports; config imports no events

    out = _check(dict[str, Any], value, where)
    for name, tp in _hints(SyncConfig).items():
        if name in out:
            out[name] = _check(tp, out[name], f"{where}.{name}")
    return out


def _items(blob: bytes, max_bytes: int) -> list:
    if len(blob) > max_bytes:
        raise EventDecodeError(f"event batch of {len(blob)} bytes is over the {max_bytes}-byte cap")
    try:
        items = json.loads(blob)
    except (ValueError, RecursionError) as exc:
        raise EventDecodeError(f"event batch is not JSON: {exc}") from None
    if not isinstance(items, list):
        raise EventDecodeError("event batch is not a list")
    return items


def encode_events(events: list[Event]) -> bytes:
    return json.dumps([e.to_dict() for e in events], separators=(",", ":")).encode()


def decode_events(blob: bytes, max_bytes: int = 64 * MAX_EVENT_BYTES) -> list[Event]:
    """Every event of a batch, or EventDecodeError for the first that does not check out."""
    return [event_from_dict(item) for item in _items(blob, max_bytes)]


# -- StepDone's binary form: a rank sends one a step, and JSON was most of the publisher's and the front's work per
# step (issue 42). A batch is its JSON list and, where it holds steps, one step block (a second ZeroMQ frame: more
# frames cost the front more than they saved, CURVE seals each); in the list a whole number n stands for the block's
# next n records, so every event keeps the rank's order. A block is STEP_MAGIC, the record size (u16), then records
# of that size, each StepDone's fields in field order: int as u64, float as f64, bool as one byte 0/1, little-endian.
# Fields are only ever added at the end: a record longer than this ddptop's is read as far as it knows the fields (as
# a wire list's extra items are), a shorter one at a field boundary past the required fields gets the later fields'
# defaults.

STEP_MAGIC = b"\xffS"  # the block's first bytes: no JSON text starts with 0xff
_CODES = {int: "Q", float: "d", bool: "B"}


def _step_layout() -> tuple[struct.Struct, dict[int, struct.Struct]]:
    """The whole record, and each record size a rank may send: every field, or the fields before any that has a
    default (an older rank's)."""
    hints, codes = _hints(StepDone), ""
    by_size: dict[int, struct.Struct] = {}
    for f in dataclasses.fields(StepDone):
        if f.default is not dataclasses.MISSING:
            by_size[struct.calcsize("<" + codes)] = struct.Struct("<" + codes)
        codes += _CODES[hints[f.name]]
    whole = by_size[struct.calcsize("<" + codes)] = struct.Struct("<" + codes)
    return whole, by_size


STEP_RECORD, _STEP_SIZES = _step_layout()
_STEP_HEADER = STEP_MAGIC + struct.pack("<H", STEP_RECORD.size)
_STEP_FIELDS = _names(StepDone)
_step_values = operator.attrgetter(*_STEP_FIELDS)
_STEP_INTS = tuple(i for i, n in enumerate(_STEP_FIELDS) if _hints(StepDone)[n] is int)
_STEP_FLOATS = tuple(i for i, n in enumerate(_STEP_FIELDS) if _hints(StepDone)[n] is float and n not in NOT_FINITE)
_STEP_BOOLS = tuple(i for i, n in enumerate(_STEP_FIELDS) if _hints(StepDone)[n] is bool)


def step_record(event: StepDone) -> bytes | None:
    """`event` as one binary record, or None when a field does not fit its code (a negative or huge count, a
    float where a count belongs): that step then travels as JSON, and the front's typed decoding judges it."""
    try:
        return STEP_RECORD.pack(*_step_values(event))
    except struct.error:
        return None


def step_block(records: list[bytes]) -> bytes:
    return _STEP_HEADER + b"".join(records)


def decode_steps(block: bytes, rank: int) -> list[Event | str]:
    """Rank `rank`'s step block, each record in order: the StepDone it checks out as, or why it was refused. A block
    that is not one (a bad header, a size that is no StepDone's, not a whole number of records) raises
    EventDecodeError."""
    if len(block) < len(_STEP_HEADER) or block[:2] != STEP_MAGIC:
        raise EventDecodeError("step block without its header")
    size = struct.unpack_from("<H", block, 2)[0]
    body = memoryview(block)[len(_STEP_HEADER):]
    layout = _STEP_SIZES.get(size) or (STEP_RECORD if size > STEP_RECORD.size else None)
    if layout is None:
        raise EventDecodeError(f"step records of {size} bytes: not a size of this ddptop's StepDone")
    if len(body) % size:
        raise EventDecodeError(f"step block of {len(body)} bytes is not a whole number of {size}-byte records")
    names = _STEP_FIELDS[:len(layout.format) - 1]
    out: list[Event | str] = []
    for at in range(0, len(body), size):
        values = layout.unpack_from(body, at)
        why = _step_refused(values, rank)
        if why:
            out.append(why)
            continue
        fields = dict(zip(names, values))
        for i in _STEP_BOOLS:
            if i < len(values):
                fields[_STEP_FIELDS[i]] = values[i] == 1
        out.append(_build(StepDone, fields) if layout is STEP_RECORD else StepDone(**fields))
    return out


_step_ints = operator.itemgetter(*_STEP_INTS)
_step_floats = operator.itemgetter(*_STEP_FLOATS)
_step_bools = operator.itemgetter(*_STEP_BOOLS, *_STEP_BOOLS)  # twice: a tuple even for one field


def _step_refused(values: tuple, rank: int, _finite=math.isfinite) -> str:
    """Why a step record is refused ("": it is not): the checks typed decoding makes of a StepDone's JSON. The common
    case in four calls (a sum of finite floats is finite, bar an overflow that the field-by-field pass then clears):
    field by field it was a third of the decode."""
    n = len(values)
    if n == len(_STEP_FIELDS) and values[0] == rank and max(_step_ints(values)) <= MAX_INT \
            and _finite(sum(_step_floats(values))) and max(_step_bools(values)) <= 1:
        return ""
    for i in _STEP_INTS:
        if i < n and values[i] > MAX_INT:
            return (f"bad step_done event: {_STEP_FIELDS[i]}: expected a whole number in 0..2^63-1, "
                    f"found {_what(values[i])}")
    for i in _STEP_FLOATS:
        if i < n and not _finite(values[i]):
            return f"bad step_done event: {_STEP_FIELDS[i]}: expected a finite number, found {_what(values[i])}"
    for i in _STEP_BOOLS:
        if i < n and values[i] > 1:
            return f"bad step_done event: {_STEP_FIELDS[i]}: expected true or false, found {values[i]!r}"
    if values[0] != rank:
        return f"a step_done event in rank {rank}'s batch claims rank {values[0]}"
    return ""


def decode_batch(blob: bytes, rank: int, max_bytes: int = 64 * MAX_EVENT_BYTES,
                 steps: bytes | None = None) -> tuple[list[Event], list[str]]:
    """Rank `rank`'s telemetry batch, each event decoded alone: (the good ones, in order, why each other one was
    refused). An event that names another rank is refused too. `steps`: the batch's step block (decode_steps), whose
    records take the places that whole numbers n ≥ 1 hold in the JSON list (the next n records each). A blob that
    is not a JSON list, a step block that is no block, or places that do not add up to its records raise
    EventDecodeError: the batch is not the rank's."""
    if steps is not None and len(blob) + len(steps) > max_bytes:
        raise EventDecodeError(f"event batch of {len(blob) + len(steps)} bytes is over the {max_bytes}-byte cap")
    records = decode_steps(steps, rank) if steps is not None else []
    placed = 0
    good: list[Event] = []
    bad: list[str] = []
    for item in _items(blob, max_bytes):
        if type(item) is int:  # a run of step records
            if not 0 < item <= len(records) - placed:
                raise EventDecodeError(f"a run of {item} step records where the block holds "
                                       f"{len(records) - placed} more")
            for record in records[placed:placed + item]:
                (bad if type(record) is str else good).append(record)
            placed += item
            continue
        try:
            event = event_from_dict(item)
        except EventDecodeError as exc:
            bad.append(str(exc))
            continue
        claimed = getattr(event, "rank", rank)
        if claimed != rank:
            bad.append(f"a {event.kind} event in rank {rank}'s batch claims rank {claimed}")
        else:
            good.append(event)
    if placed != len(records):
        raise EventDecodeError(f"the step block holds {len(records)} records, the batch places {placed}")
    return good, bad


class Source(Protocol):
    """Anything that yields events: a live job or a recording. The UI cannot tell them apart."""

    def poll(self) -> list[Event]:
        """Events that arrived since the last call (never blocks for long)."""
        ...

    def close(self) -> None: ...
