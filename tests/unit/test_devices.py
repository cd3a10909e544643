"""The device policy with a faked GPU count, the loader's workers, and the interface every process group binds to."""

from __future__ import annotations

import pytest

from ddptop.errors import UsageError
from ddptop.train import devices
from ddptop.train.devices import Placement, place
from ddptop.rendezvous import resolve


@pytest.mark.parametrize("backend,device,ranks,gpus,want", [
    ("auto", "auto", 2, 0, ("cpu", "gloo")),  # this machine
    ("auto", "auto", 1, 1, ("cuda", "nccl")),
    ("auto", "auto", 4, 4, ("cuda", "nccl")),
    ("auto", "auto", 2, 1, ("cpu", "gloo")),  # 2 ranks, 1 GPU: nccl would refuse ("Duplicate GPU detected")
    ("nccl", "auto", 2, 2, ("cuda", "nccl")),
    ("gloo", "auto", 2, 2, ("cpu", "gloo")),  # gloo stays on CPU unless asked
    ("gloo", "cuda", 2, 1, ("cuda", "gloo")),  # gloo may share a GPU between ranks
    ("auto", "cuda", 2, 1, ("cuda", "gloo")),
    ("auto", "cuda", 2, 2, ("cuda", "nccl")),
    ("auto", "cpu", 2, 8, ("cpu", "gloo")),
])
def test_the_policy_picks_nccl_only_when_every_local_rank_has_its_own_gpu(backend, device, ranks, gpus, want):
    placement = place(backend, device, ranks, gpus)
    assert (placement.device, placement.backend) == want
    if (backend, device, ranks, gpus) == ("auto", "auto", 2, 1):
        assert "--local 1" in placement.note  # the user learns why the GPU is not used


@pytest.mark.parametrize("backend,device,ranks,gpus,words", [
    ("nccl", "auto", 2, 0, ["nccl", "no", "--backend gloo"]),
    ("nccl", "auto", 2, 1, ["one GPU per rank", "2 ranks", "1 GPU", "--local 1", "--backend gloo"]),
    ("nccl", "cuda", 3, 2, ["one GPU per rank", "--backend gloo"]),
    ("nccl", "cpu", 1, 1, ["--device cpu", "--backend gloo"]),
    ("auto", "cuda", 1, 0, ["--device cuda", "none is visible"]),
])
def test_what_cannot_run_is_refused_in_one_line_that_suggests_gloo(backend, device, ranks, gpus, words, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    with pytest.raises(UsageError) as err:
        place(backend, device, ranks, gpus)
    text = str(err.value)
    assert "\n" not in text and all(w in text for w in words), text
    if gpus == 0:
        assert "CUDA_VISIBLE_DEVICES=''" in text


def test_gpu_index_one_gpu_per_rank_under_nccl_shared_under_gloo():
    assert [Placement("cuda", "nccl").gpu_index(r, 4) for r in range(4)] == [0, 1, 2, 3]
    assert [Placement("cuda", "gloo").gpu_index(r, 2) for r in range(4)] == [0, 1, 0, 1]
    assert Placement("cpu", "gloo").gpu_index(1, 2) is None


def test_local_defaults_to_one_rank_per_visible_gpu():
    assert devices.default_local("auto", "auto", 0) == 2
    assert devices.default_local("auto", "auto", 8) == 8
    assert devices.default_local("nccl", "auto", 1) == 1
    assert devices.default_local("gloo", "auto", 4) == 2  # gloo trains on CPU
    assert devices.default_local("auto", "cpu", 4) == 2
    assert resolve(None, None, None, None, None, env={}, default_local=3).world_size == 3
    assert resolve(None, None, None, None, None, env={}).world_size == 2


def test_gloo_on_cuda_tensors_refuses_gather_scatter():
    devices.check_strategy("cuda", "nccl", "gather-scatter")
    devices.check_strategy("cpu", "gloo", "gather-scatter")
    for ok in ("single", "allreduce", "ddp"):
        devices.check_strategy("cuda", "gloo", ok)
    with pytest.raises(UsageError, match="gather and scatter"):
        devices.check_strategy("cuda", "gloo", "gather-scatter")


def test_loader_workers_zero_on_cpu_and_cores_per_rank_up_to_four_on_a_gpu():
    assert devices.loader_workers(-1, "cpu", 2, cpus=16) == 0
    assert devices.loader_workers(3, "cpu", 2, cpus=16) == 3  # as given
    assert devices.loader_workers(-1, "cuda", 2, cpus=16) == 4
    assert devices.loader_workers(-1, "cuda", 8, cpus=16) == 2
    assert devices.loader_workers(-1, "cuda", 8, cpus=4) == 1
    assert devices.loader_workers(0, "cuda", 1, cpus=16) == 0


def test_both_backends_bind_to_the_job_interface():
    env: dict[str, str] = {}
    assert devices.bind_interfaces("eth1", typed=False, env=env) == {"GLOO_SOCKET_IFNAME": "eth1",
                                                                     "NCCL_SOCKET_IFNAME": "eth1"}
    env = {"NCCL_SOCKET_IFNAME": "ib0"}  # the user's own setting beats a detected interface
    assert devices.bind_interfaces("eth1", typed=False, env=env) == {"GLOO_SOCKET_IFNAME": "eth1",
                                                                     "NCCL_SOCKET_IFNAME": "ib0"}
    assert devices.bind_interfaces("eth2", typed=True, env=env) == {"GLOO_SOCKET_IFNAME": "eth2",
                                                                    "NCCL_SOCKET_IFNAME": "eth2"}  # --iface wins
