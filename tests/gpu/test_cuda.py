"""On a machine with an NVIDIA GPU: nccl at world size 1, CUDA-event step time against the wall clock, no
synchronizing CUDA call on the training thread, a real out-of-memory rolled back through `ddptop ctl set`, real NVML
fields. The checks are scripts/gpu_check.py's, called here one by one (`scripts/gpu_check.sh suite` runs this
module); without a GPU every test skips, the one skip CI allows (tests/skips.py). Nothing here needs textual.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from skips import GPU_SKIP

pytestmark = [pytest.mark.alone,  # step time against the wall clock: nothing else may run beside it
              pytest.mark.skipif(not torch.cuda.is_available(), reason=f"{GPU_SKIP}: torch.cuda.is_available() is "
                                 "False (scripts/gpu_check.sh suite runs these on a GPU machine)")]


REPO = Path(__file__).resolve().parents[2]


def load_gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", REPO / "scripts" / "gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def gpu_check(tmp_path_factory):
    """scripts/gpu_check.py with its logs and recordings in a folder of this module's."""
    module = load_gpu_check()
    module.OUT = tmp_path_factory.mktemp("gpu")
    return module


@pytest.fixture
def checks(gpu_check):
    """Runs gpu_check's checks; the test fails with every `FAIL name` they printed."""
    gpu_check.FAILED.clear()
    yield gpu_check
    assert gpu_check.FAILED == [], f"failed: {gpu_check.FAILED} (each `FAIL` line above says what it saw)"


@pytest.fixture(scope="module")
def nccl1(gpu_check) -> str:
    """The recording of one rank on cuda:0 with nccl: VGG-11, 60 steps, spans every 5th."""
    gpu_check.FAILED.clear()
    db = gpu_check.run_nccl1()
    assert db and not gpu_check.FAILED, f"the nccl run failed: {gpu_check.FAILED} (log: {gpu_check.OUT}/nccl1.log)"
    return db


def test_nccl_world_size_1_trains_on_cuda_0_with_cuda_event_spans(checks, nccl1):
    checks.check_spans(nccl1)


def test_each_memory_sample_is_torchs_sizes_and_the_cuda_allocators_peak(checks, nccl1):
    checks.check_memory(nccl1)


def test_cuda_event_step_time_is_the_wall_clock_within_20_percent(checks, nccl1):
    checks.check_gpu_time(nccl1)  # mean CUDA-event step time / wall clock per step over steps 10..59 in (0.8, 1.2)


def test_nvml_fields_match_torch_and_nvidia_smi(checks, nccl1):
    checks.check_nvml(nccl1)


def test_no_synchronizing_call_on_the_training_thread(checks):
    checks.check_no_sync_on_the_training_thread()


def test_placement_gloo_on_cuda_tensors_and_the_uuid_device(checks):
    checks.check_placement()
    checks.check_gloo_on_cuda()
    checks.check_uuid_mapping()


def test_a_real_out_of_memory_is_rolled_back_by_ctl_set_and_the_memory_comes_back(checks):
    checks.check_live_roll_back()


def test_zero_stages_switch_on_one_step_and_hold_memory_as_they_shard(checks):
    """Issue 43 on the device: ddp -> zero3 -> zero1 -> zero2 -> single -> ddp in one nccl job; zero1 on 2 gloo
    ranks sharing the GPU."""
    checks.check_sharded()
