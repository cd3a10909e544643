"""Frozen run configuration: what to train and how gradients are synchronized, checked on construction."""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass, field
from typing import Any

from ddptop.errors import UsageError

RUNS_DIR_ENV = "DDPTOP_RUNS_DIR"  # the folder of default recordings (tests point it at a temporary one)
DEFAULT_RUNS_DIR = "ddptop-runs"  # also where a --save that failed at the end keeps the model (train.save)

STRATEGIES = ("single", "gather-scatter", "allreduce", "ddp", "zero1", "zero2", "zero3")
BUCKETED = ("ddp", "zero1")  # DDP's bucketed all-reduce: bucket_mb is theirs
SHARDED = ("zero2", "zero3")  # FSDP2's fully_shard: shard_unit is theirs
ZERO = ("zero1", "zero2", "zero3")  # the strategy builds the optimizer (its state sharded): no compress, no own loop
MODELS = ("vgg11", "resnet18", "tiny", "resnet50", "bert-mini")
DATASETS = ("synthetic", "cifar10", "mnist", "tokens")
IMAGE_DATASETS = ("synthetic", "cifar10", "mnist")  # the rest (tokens, the user's own) count samples, not images
LOSSES = ("cross-entropy", "mse")
BACKENDS = ("auto", "gloo", "nccl")
PROBE_LEVELS = ("all", "system", "off")
DEVICES = ("auto", "cpu", "cuda")

MAX_BATCH_SIZE = 65536
MAX_BUCKET_MB = 4096.0
MAX_ACCUM = 1024  # micro-steps per step: 1024 × batch 64 is a 65k-sample step, past any large-batch recipe
MAX_WARMUP_STEPS = 10**7
COMPRESSIONS = ("none", "fp16", "bf16", "powersgd")  # powersgd:R names the rank R (1 when left out)
MAX_POWERSGD_RANK = 64


def _check_choice(what: str, value: Any, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise UsageError(f"unknown {what} {value!r}: choose one of {', '.join(choices)}")


_SPEC = re.compile(r"^(?P<where>[^:]+):(?P<name>[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*)$")


def is_spec(value: Any) -> bool:
    """`MODULE:CALLABLE`, `path/file.py:CALLABLE` or `torchvision:NAME`: the user's code, not a built-in name."""
    return isinstance(value, str) and _SPEC.match(value) is not None


def _check_spec(flag: str, value: Any, builtins: tuple[str, ...], torchvision: bool = False) -> None:
    """A built-in name or the text of a spec; whether the code imports is train.specs' to say, on the rank side."""
    if value in builtins or is_spec(value):
        return
    forms = "torchvision:NAME, MODULE:CALLABLE or path/file.py:CALLABLE" if torchvision else \
        "MODULE:CALLABLE or path/file.py:CALLABLE"
    raise UsageError(f"unknown {flag} {value!r}: choose one of {', '.join(builtins)}, or {forms}")


@dataclass(frozen=True)
class SyncConfig:
    """The part of a run the user may change live: every rank applies it at the same step."""

    strategy: str = "ddp"
    bucket_mb: float = 25.0
    async_op: bool = False
    batch_size: int = 64  # per rank, per micro-step
    lr: float = 0.1
    accum: int = 1  # micro-steps per step (gradient accumulation): a step trains accum × batch_size per rank
    compress: str = "none"  # gradients on the wire: none, fp16, bf16, powersgd:R (DDP only)
    lr_warmup_steps: int = 0  # gradual warm-up (Goyal et al.): lr × (k+1)/N at the k-th step after lr is set
    shard_unit: str = ""  # zero2/zero3: NAME[,NAME] module classes or qualified names; "": each top-level block

    def __post_init__(self) -> None:
        _check_choice("strategy", self.strategy, STRATEGIES)
        if isinstance(self.batch_size, bool) or not isinstance(self.batch_size, int):
            raise UsageError(f"batch size must be a whole number, got {self.batch_size!r}")
        if not 0 < self.batch_size <= MAX_BATCH_SIZE:
            raise UsageError(f"batch size must be between 1 and {MAX_BATCH_SIZE}, got {self.batch_size}")
        if not _is_number(self.bucket_mb) or not 0 < self.bucket_mb <= MAX_BUCKET_MB:
            raise UsageError(f"bucket size must be a number of MB in (0, {MAX_BUCKET_MB:g}], got {self.bucket_mb!r}")
        if not _is_number(self.lr) or not 0 < self.lr <= 100:
            raise UsageError(f"learning rate must be a number in (0, 100], got {self.lr!r}")
        if not isinstance(self.async_op, bool):
            raise UsageError(f"async_op must be true or false, got {self.async_op!r}")
        if self.async_op and self.strategy != "allreduce":
            raise UsageError(f"async_op applies only to allreduce, not to {self.strategy}")
        for name, top in (("accum", MAX_ACCUM), ("lr_warmup_steps", MAX_WARMUP_STEPS)):
            value = getattr(self, name)
            low = 1 if name == "accum" else 0
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= top:
                raise UsageError(f"{name} must be a whole number between {low} and {top}, got {value!r}")
        object.__setattr__(self, "compress", _compression(self.compress))  # powersgd → powersgd:1, one spelling
        if self.compress != "none" and self.strategy == "single":
            raise UsageError(f"compress={self.compress} means nothing for single, which sends no gradients")
        if self.compress != "none" and self.strategy in ZERO:
            raise UsageError(f"compress={self.compress} applies to allreduce, gather-scatter and ddp, not to "
                             f"{self.strategy} (torch's sharded strategies send gradients as they are)")
        _check_units(self.shard_unit)
        if self.compress.startswith("powersgd") and self.strategy != "ddp":
            raise UsageError(f"compress={self.compress} applies only to ddp (a DDP comm hook), not to {self.strategy}")

    @property
    def powersgd_rank(self) -> int:
        """PowerSGD's matrix_approximation_rank R (0: not PowerSGD)."""
        return int(self.compress.partition(":")[2]) if self.compress.startswith("powersgd") else 0

    def replace(self, **changes: Any) -> "SyncConfig":
        return dataclasses.replace(self, **changes)

    def changed(self, changes: dict[str, Any]) -> "SyncConfig":
        """This configuration with `changes` (strategy, bucket_mb, async_op, batch_size, lr), as a user means them.

        A setting that means nothing for the resulting strategy is refused (bucket_mb is DDP's, async_op is
        allreduce's, powersgd is DDP's, compression is nothing to single); leaving allreduce turns async_op off
        and leaving for a strategy that cannot carry the compression turns it off, unless the change names it.
        bucket_mb is kept while another strategy runs, for the next switch to DDP, but only DDP shows it."""
        strategy = changes.get("strategy", self.strategy)
        cleared = {"async_op": False} if changes.get("strategy", "allreduce") != "allreduce" else {}
        if "strategy" in changes and (strategy in ("single", *ZERO) or (strategy != "ddp" and self.powersgd_rank)):
            cleared["compress"] = "none"  # a compression the new strategy cannot carry ends with it, as async_op
        result = dataclasses.replace(self, **{**cleared, **changes})
        if "bucket_mb" in changes and result.strategy not in BUCKETED:
            raise UsageError(f"bucket_mb applies only to ddp and zero1, not to {result.strategy}: set strategy=ddp too")
        if "shard_unit" in changes and result.strategy not in SHARDED:
            raise UsageError(f"shard_unit applies only to zero2 and zero3, not to {result.strategy}: "
                             "set strategy=zero3 too")
        return result

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def describe(self) -> str:
        text = self.strategy
        if self.strategy in BUCKETED:
            text += f" bucket={self.bucket_mb:g}MB"
        if self.strategy in SHARDED and self.shard_unit:
            text += f" unit={self.shard_unit}"
        if self.strategy == "allreduce" and self.async_op:
            text += " async"
        if self.compress != "none":
            text += f" {self.compress}"
        text += f" batch={self.batch_size}"
        if self.accum > 1:
            text += f" accum={self.accum}"
        return text + (f" warmup={self.lr_warmup_steps}" if self.lr_warmup_steps else "")


_UNIT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z0-9_]+)*$")  # a class name or a qualified module name
MAX_UNITS = 64


def _check_units(text: Any) -> None:
    """shard_unit's text: "" or NAME[,NAME] (whether each names a module of the model is the rank's to say)."""
    if not isinstance(text, str):
        raise UsageError(f"shard_unit must be module names like Linear or features.0, got {text!r}")
    names = text.split(",") if text else []
    if len(names) > MAX_UNITS or not all(_UNIT.match(name) for name in names):
        raise UsageError(f"shard_unit must be up to {MAX_UNITS} module class names or qualified module names "
                         f"separated by commas (Linear,features.0), got {text[:80]!r}")


def _compression(text: Any) -> str:
    """`none`, `fp16`, `bf16`, `powersgd`, `powersgd:R` → the one spelling (powersgd:R), or UsageError."""
    name, colon, rank = str(text).partition(":") if isinstance(text, str) else ("", "", "")
    if name not in COMPRESSIONS or (colon and name != "powersgd"):
        raise UsageError(f"unknown compression {text!r}: choose one of none, fp16, bf16, powersgd[:R]")
    if name != "powersgd":
        return name
    if colon and not (rank.isdigit() and 1 <= int(rank) <= MAX_POWERSGD_RANK):
        raise UsageError(f"powersgd's rank R must be a whole number from 1 to {MAX_POWERSGD_RANK}, got {rank!r}")
    return f"powersgd:{int(rank) if colon else 1}"


def _is_number(value: Any) -> bool:
    try:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    except OverflowError:  # an int too large for a float (10**400 from JSON or a command line)
        return False


@dataclass(frozen=True)
class RunConfig:
    """Everything a rank needs to train; identical on every rank (rank identity lives in Rendezvous)."""

    model: str = "vgg11"
    dataset: str = "synthetic"
    loss: str = "cross-entropy"
    collate: str = ""  # --collate SPEC: the user's collate_fn for the loaders ("": torch's default_collate)
    tokens: str = ""  # --tokens SPEC: the user's count of a batch's tokens ("": an `attention_mask` summed, else none)
    data_dir: str = "./data"
    sync: SyncConfig = field(default_factory=SyncConfig)
    epochs: int = 1
    steps: int = 0  # 0: run the epochs to the end; otherwise stop after this many steps in all
    seed: int = 0
    backend: str = "auto"
    device: str = "auto"  # auto: CUDA under nccl, CPU under gloo (the policy: train/devices.py)
    workers: int = -1  # loader worker processes per rank; -1: 0 on CPU, one per core up to 4 on a GPU
    probes: str = "all"
    span_every: int = 0  # 0: metrics.span_cadence picks it from the world size
    iface: str | None = None
    threads: int = 0  # 0: cores / local ranks
    synthetic_size: int = 12800  # training images of the synthetic set (test split: a fifth of that)
    eval: bool = True
    # a sweep runs these sync configs one after another in one job, as segments: warm-up steps, then measured ones
    sweep: tuple[SyncConfig, ...] = ()
    sweep_warmup: int = 5
    sweep_measure: int = 20
    sweep_until_oom: bool = False  # a sweep of growing batches stops at the first one that does not fit
    profile: str = ""
    save: str = ""  # --save FILE: rank 0 writes its final state_dict here (torch.save)

    def __post_init__(self) -> None:
        _check_spec("model", self.model, MODELS, torchvision=True)
        _check_spec("dataset", self.dataset, DATASETS)
        _check_spec("loss", self.loss, LOSSES)
        if self.collate and not is_spec(self.collate):
            raise UsageError(f"--collate {self.collate!r}: give MODULE:CALLABLE or path/file.py:CALLABLE")
        if self.tokens and not is_spec(self.tokens):
            raise UsageError(f"--tokens {self.tokens!r}: give MODULE:CALLABLE or path/file.py:CALLABLE")
        _check_choice("backend", self.backend, BACKENDS)
        _check_choice("device", self.device, DEVICES)
        if isinstance(self.workers, bool) or not isinstance(self.workers, int) or self.workers < -1:
            raise UsageError(f"--workers must be a whole number ≥ 0, got {self.workers!r}")
        _check_choice("probe level", self.probes, PROBE_LEVELS)
        for name in ("epochs", "steps", "span_every", "threads", "synthetic_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise UsageError(f"--{name.replace('_', '-')} must be a whole number ≥ 0, got {value!r}")
        if self.epochs == 0 and self.steps == 0:
            raise UsageError("nothing to run: --epochs and --steps are both 0")
        if self.synthetic_size < 1:
            raise UsageError("--synthetic-size must be at least 1")
        if self.sweep and (self.sweep_measure < 1 or self.sweep_warmup < 0):
            raise UsageError("a sweep needs at least 1 measured step per configuration")

    @property
    def first_sync(self) -> SyncConfig:
        """The configuration segment 0 runs: a sweep's first, else `sync`."""
        return self.sweep[0] if self.sweep else self.sync

    def sweep_steps(self) -> int:
        """Steps per sweep segment."""
        return self.sweep_warmup + self.sweep_measure

    def replace(self, **changes: Any) -> "RunConfig":
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "RunConfig":
        data = dict(data)
        data["sync"] = SyncConfig(**data.get("sync", {}))
        data["sweep"] = tuple(SyncConfig(**item) for item in data.get("sweep", ()))
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})
