"""Where a rank trains: the device and backend policy (one rank per GPU under nccl), the loader's workers and
the network interface the process groups bind to. Pure functions of their inputs, so a test can fake the GPUs."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import MutableMapping

from ddptop.config import SHARDED
from ddptop.errors import UsageError

# gloo moves CUDA tensors only for these collectives (torch.distributed's backend table): gather and scatter
# would fail in the middle of a step, so a strategy that needs them is refused up front (zero1: DDP's all-reduce
# and broadcasts; zero2/zero3 under gloo on CUDA were never tried, so they are refused too)
GLOO_CUDA_STRATEGIES = ("single", "allreduce", "ddp", "zero1")
MAX_AUTO_WORKERS = 4  # loader processes per rank on a GPU when --workers is not given


@dataclass(frozen=True)
class Placement:
    """What a machine's ranks train on: `device` "cpu" or "cuda", `backend` "gloo" or "nccl"; `note` says why
    when ddptop chose something the user may not expect (empty otherwise)."""

    device: str
    backend: str
    note: str = ""

    def gpu_index(self, local_rank: int, gpus: int) -> int | None:
        """The CUDA index of a local rank: its own GPU under nccl, shared round-robin under gloo."""
        if self.device != "cuda":
            return None
        return local_rank if self.backend == "nccl" else local_rank % gpus


def thread_count(threads: int, local_ranks: int) -> int:
    """Compute threads per rank: as given (--threads), else OMP_NUM_THREADS where it is set (the user's, or torchrun's
    1), else N ranks on one machine each get cores/N (oversubscribed ranks ruin every timing). Torch-free: the run
    command sets OMP_NUM_THREADS to it before torch loads, so that every thread of a rank computes with this one
    count (`openmp_default`)."""
    return threads or env_threads() or max(1, (os.cpu_count() or 1) // max(1, local_ranks))


def env_threads() -> int:
    """OMP_NUM_THREADS as OpenMP reads it (its first level: "4,2" is 4), 0 where it is unset or not a count."""
    first = os.environ.get("OMP_NUM_THREADS", "").split(",")[0].strip()
    return int(first) if first.isdigit() and 0 < int(first) <= 4096 else 0


def openmp_default() -> int:
    """The OpenMP thread count a new thread of this process starts with: the one gloo's threads compute with, where
    PowerSGD's math runs (OpenMP read OMP_NUM_THREADS once, when torch loaded it). 0 where no libgomp is loaded.
    A rank whose main thread used another count (torch.set_num_threads) trained a different model from its peers
    under PowerSGD: bitwise apart after a few steps (tests/cli/test_threads_agree.py)."""
    import ctypes
    import threading

    try:
        with open("/proc/self/maps") as maps:
            path = next((line.split()[-1] for line in maps if "libgomp" in line.rsplit("/", 1)[-1]), "")
        if not path:
            return 0
        get = ctypes.CDLL(path).omp_get_max_threads
    except (OSError, AttributeError):
        return 0
    out: list[int] = []
    thread = threading.Thread(target=lambda: out.append(int(get())), name="ddptop-omp-probe")
    thread.start()
    thread.join()
    return out[0] if out else 0


def agreed_threads(wanted: int, omp: int) -> tuple[int, str]:
    """The count a rank computes with, every thread of it: `wanted` where OpenMP's default agrees (or is unknown, 0),
    else OpenMP's (the threads gloo starts cannot be told another), with the line that says why."""
    if not omp or omp == wanted:
        return wanted, ""
    return omp, (f"computes with {omp} threads, not {wanted}: torch loaded before OMP_NUM_THREADS={wanted} was set, "
                 f"and all of a rank's threads need one count (gloo's run PowerSGD); set OMP_NUM_THREADS={wanted} "
                 "before the script starts")


def visible_gpus() -> int:
    """CUDA devices this process can use (CUDA_VISIBLE_DEVICES applied); 0 without CUDA."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _visible_text() -> str:
    value = os.environ.get("CUDA_VISIBLE_DEVICES")
    if value is None:
        return ""
    return f" (CUDA_VISIBLE_DEVICES={value!r})"


def place(backend: str, device: str, local_ranks: int, gpus: int) -> Placement:
    """The policy: nccl needs one GPU per local rank; `auto` picks nccl only when every local rank has its own
    GPU, else gloo on CPU; gloo stays on CPU unless `--device cuda` asks for CUDA tensors."""
    if device == "cpu":
        if backend == "nccl":
            raise UsageError("--backend nccl needs CUDA tensors, not --device cpu: use --backend gloo")
        return Placement("cpu", "gloo")
    if gpus == 0:
        if backend == "nccl" or device == "cuda":
            asked = "--backend nccl" if backend == "nccl" else "--device cuda"
            raise UsageError(f"{asked} needs a GPU and none is visible{_visible_text()}: use --backend gloo "
                             "(trains on CPU)")
        return Placement("cpu", "gloo")
    fits = local_ranks <= gpus
    if backend == "nccl" and not fits:
        raise UsageError(f"--backend nccl needs one GPU per rank: {local_ranks} ranks on this machine, {gpus} GPU"
                         f"{'s' if gpus != 1 else ''} visible{_visible_text()}; use --local {gpus} or --backend gloo")
    if backend == "gloo":
        return Placement("cuda" if device == "cuda" else "cpu", "gloo")
    if backend == "nccl" or fits:
        return Placement("cuda", "nccl")
    if device == "cuda":  # auto backend, CUDA asked for, ranks share GPUs: only gloo allows that
        return Placement("cuda", "gloo", f"{local_ranks} ranks share {gpus} GPU(s): gloo on CUDA tensors")
    return Placement("cpu", "gloo", f"{local_ranks} ranks and {gpus} GPU(s): nccl needs one GPU per rank, so gloo "
                                    f"on CPU (--local {gpus} trains on the GPUs)")


def default_local(backend: str, device: str, gpus: int) -> int:
    """`--local` when nothing says how many ranks: one per visible GPU on a CUDA machine, else 2."""
    if gpus > 0 and backend != "gloo" and device != "cpu":
        return gpus
    return 2


def check_strategy(placement_device: str, backend: str, strategy: str) -> None:
    """A strategy the backend cannot run on this device is refused before any rank sees it."""
    if placement_device == "cuda" and backend == "gloo" and strategy not in GLOO_CUDA_STRATEGIES:
        needs = "FSDP2's all-gather and reduce-scatter, not tried" if strategy in SHARDED else \
            "gather and scatter, which gloo does not run"
        raise UsageError(f"{strategy} needs {needs} on CUDA tensors: use "
                         f"--backend nccl, --device cpu, or one of {', '.join(GLOO_CUDA_STRATEGIES)}")


def loader_workers(workers: int, device: str, local_ranks: int, cpus: int | None = None) -> int:
    """Loader processes per rank: as given, else 0 on CPU (the rank's threads do the work) and on a GPU one
    per core the rank has, up to MAX_AUTO_WORKERS, so loading overlaps the GPU's step."""
    if workers >= 0:
        return workers
    if device != "cuda":
        return 0
    cores = (cpus if cpus is not None else os.cpu_count() or 1) // max(1, local_ranks)
    return max(1, min(MAX_AUTO_WORKERS, cores))


def bind_interfaces(iface: str, typed: bool, env: MutableMapping[str, str] | None = None) -> dict[str, str]:
    """Make gloo and nccl bind to the job's interface, for every group (the control group included).

    Must run before the first process group exists: both read these variables when a group is created.
    A typed `--iface` wins over the environment; a detected one leaves a variable the user set alone."""
    env = os.environ if env is None else env
    for name in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
        if typed or not env.get(name):
            env[name] = iface
    return {name: env[name] for name in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")}
