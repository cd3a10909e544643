"""Which steps carry per-layer spans (issue 41): every 10th by default, every (world size / 16)th above 160 ranks so
that a front receives and records ~160 ranks' sampled steps per 10 steps at most (at 1,024 ranks the spans were half
of what the front spent: benchmarks/collector_throughput.py), and `--span-every N` as given. Checked on the steps a
real training loop marks as sampled, through the probe the rank builds (train.worker.make_probe)."""

from __future__ import annotations

import pytest
import torch

from ddptop.config import RunConfig, SyncConfig
from ddptop.events import StepDone
from ddptop.train.loop import Trainer
from ddptop.train.worker import make_probe

STEPS = 130


@pytest.fixture(autouse=True)
def one_thread():
    """One thread, as a rank beside others gets: OpenMP's spinning threads on a busy 2-core machine made each tiny
    step 0.3 s instead of milliseconds."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def sampled_steps(span_every: int, world_size: int) -> list[int]:
    records: list = []
    cfg = RunConfig(model="tiny", sync=SyncConfig(strategy="single", batch_size=4), steps=STEPS, synthetic_size=64,
                    eval=False, backend="gloo", span_every=span_every)
    probe = make_probe(cfg, 0, world_size, torch.device("cpu"), records.append)
    Trainer(cfg, 0, 1, torch.device("cpu"), records.append, probe).run()
    events = [e for r in records for e in (r.resolve() if hasattr(r, "resolve") else [r])]
    return [e.step for e in events if isinstance(e, StepDone) and e.sampled]


@pytest.mark.parametrize("span_every, world_size, every", [
    (0, 2, 10), (0, 160, 10), (0, 161, 11), (0, 1024, 64),  # the default (segment 0's first step is never sampled)
    (3, 1024, 3), (25, 2, 25),  # --span-every N: as given, at any size
])
def test_the_sampled_steps_follow_the_flag_or_the_world_size(span_every, world_size, every):
    assert sampled_steps(span_every, world_size) == list(range(1, STEPS, every))


def test_a_negative_span_every_is_one_line():
    from ddptop.errors import UsageError

    with pytest.raises(UsageError, match="--span-every must be a whole number ≥ 0, got -1"):
        RunConfig(span_every=-1)
