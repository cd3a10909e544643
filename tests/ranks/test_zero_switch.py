"""ZeRO stages switched live on real gloo ranks (issue 43): ddp → zero3 → zero1 → single trains what one process
trains on the same global batches, momentum carried over every switch, and every rank's fingerprint (taken on the
full, gathered parameters) is equal after each switch.

Three gloo ranks train the BatchNorm-free tiny CNN (SGD momentum 0.9, weight decay 1e-4) while `ddptop ctl`
switches ddp → zero3 (units: every Conv2d and Linear, FSDP2 reshard_after_forward=True) → zero1
(ZeroRedundancyOptimizer) → single. One process then replays the same steps: each step the mean of the ranks' mean
gradients (single: rank 0's alone), with one SGD whose momentum never restarts. Had a switch dropped or mixed up the
momentum (a new optimizer starting at zero), or a rank kept a stale shard, rank 0's saved parameters would differ.
A request for a shard unit that names no module is refused in one line, the job unchanged.
"""

from __future__ import annotations

import time

import pytest
import torch
from torch import nn

from ddptop.config import RunConfig, SyncConfig
from ddptop.errors import DdptopError
from ddptop.events import ConfigApplied, RunFinished
from ddptop.train.data import build_datasets, make_loader
from ddptop.train.models import build_model
from jobs import connect, run_job, steps_of
import ports

TOKEN = "zero-switch-token"
WORLD = 3
STEPS = 400  # a bound: the script stops the job 4 steps after its last switch, however fast the steps run
SWITCHES = [{"strategy": "zero3", "shard_unit": "Conv2d,Linear"}, {"strategy": "zero1"}, {"strategy": "single"}]
TOLERANCE = 1e-6  # measured 3.0e-08: FSDP2 reduce-scatters (sum, then divide by N) in its own order


@pytest.fixture(scope="module")
def switched(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("DDPTOP_TEST_MODEL", "no-batch-norm,sleep-ms=25")  # slow enough to switch three times
    saved = tmp_path_factory.mktemp("save") / "model.pt"
    port = ports.port()
    cfg = RunConfig(model="tiny", sync=SyncConfig(strategy="ddp", batch_size=8, lr=0.05), steps=STEPS,
                    synthetic_size=480, span_every=4, eval=False, save=str(saved), seed=5, threads=1)

    refusals = []

    def script(collected):
        client = connect(port, TOKEN, 60)
        try:  # a unit that names no module of the model: refused by rank 0 before any rank sees it
            client.send("set", {"strategy": "zero3", "shard_unit": "NoSuchBlock"}, timeout_s=30)
        except DdptopError as exc:
            refusals.append(str(exc))
        for changes in SWITCHES:
            reached = max((d.step for d in steps_of(collected)), default=0) + 4
            while max((d.step for d in steps_of(collected)), default=0) < reached:
                time.sleep(0.02)
            client.send("set", changes, timeout_s=30)
        reached = max((d.step for d in steps_of(collected)), default=0) + 4
        while max((d.step for d in steps_of(collected)), default=0) < reached:
            time.sleep(0.02)
        client.send("stop", timeout_s=30)

    try:
        code, events = run_job(cfg, world_size=WORLD, port=port, token=TOKEN, script=script, timeout_s=90)
    finally:
        mp.undo()
    assert code == 0
    return cfg, events, torch.load(saved, map_location="cpu", weights_only=True), refusals


def _replay(cfg: RunConfig, configs: dict[int, dict], steps: int = STEPS, world: int = WORLD) -> nn.Module:
    torch.manual_seed(cfg.seed)
    model = build_model("tiny", batch_norm=False)
    optimizer = torch.optim.SGD(model.parameters(), lr=cfg.sync.lr, momentum=0.9, weight_decay=1e-4)
    train, _ = build_datasets(cfg)
    loaders = [make_loader(train, cfg.sync.batch_size, r, world, cfg.seed, train=True) for r in range(world)]
    epochs, iterators = [0] * world, [None] * world
    criterion = nn.CrossEntropyLoss()

    def batch(rank: int):
        while True:
            if iterators[rank] is None:
                loaders[rank][1].set_epoch(epochs[rank])
                iterators[rank] = iter(loaders[rank][0])
            try:
                return next(iterators[rank])
            except StopIteration:
                epochs[rank], iterators[rank] = epochs[rank] + 1, None

    for step in range(steps):
        config = configs[max(s for s in configs if s <= step)]
        grads = []
        for rank in range(world):  # every rank draws its batch, also under single (its data order goes on)
            optimizer.zero_grad(set_to_none=True)
            inputs, labels = batch(rank)
            criterion(model(inputs), labels).backward()
            grads.append([p.grad.clone() for p in model.parameters()])
        for index, param in enumerate(model.parameters()):
            param.grad = grads[0][index] if config["strategy"] == "single" else \
                sum(g[index] for g in grads) / world
        optimizer.step()
    return model


def test_ddp_zero3_zero1_single_train_what_one_process_trains(switched):
    cfg, events, saved, _ = switched
    applied = [e for e in events if isinstance(e, ConfigApplied) and e.rank == 0]
    assert [e.config["strategy"] for e in applied] == ["ddp", "zero3", "zero1", "single"]
    ran = ran_steps(events)
    assert all(0 < a.step < b.step < ran for a, b in zip(applied[1:], applied[2:]))
    reference = _one_thread(_replay, cfg, {e.step: e.config for e in applied}, steps=ran)
    ours = list(saved.values())
    theirs = [p.detach() for p in reference.parameters()]
    assert len(ours) == len(theirs)
    worst = max((a - b).abs().max().item() for a, b in zip(ours, theirs))
    assert worst < TOLERANCE, f"largest parameter difference {worst:.2e} after {ran} steps"


def test_every_rank_has_one_fingerprint_after_each_switch(switched):
    _, events, _, _ = switched
    applied = [e for e in events if isinstance(e, ConfigApplied)]
    by_segment: dict[int, dict[int, tuple[int, str]]] = {}
    for e in applied:
        by_segment.setdefault(e.segment, {})[e.rank] = (e.step, e.fingerprint)
    assert sorted(by_segment) == [0, 1, 2, 3]
    for segment, ranks in by_segment.items():
        assert sorted(ranks) == list(range(WORLD)), segment
        assert len(set(ranks.values())) == 1, (segment, ranks)  # the same step, the same parameters
    assert len({ranks[0][1] for ranks in by_segment.values()}) == 4  # training moved the model between switches
    finished = {e.rank: e.fingerprint for e in events if isinstance(e, RunFinished)}
    assert len(finished) == WORLD and len(set(finished.values())) == WORLD  # single: the ranks drifted apart


def test_a_shard_unit_that_names_no_module_is_refused_and_the_job_goes_on(switched):
    _, events, _, refusals = switched
    assert len(refusals) == 1 and "refused" in refusals[0] and "'NoSuchBlock' names no module" in refusals[0], refusals
    assert "\n" not in refusals[0]
    applied = [e.config["strategy"] for e in events if isinstance(e, ConfigApplied) and e.rank == 0]
    assert applied == ["ddp", "zero3", "zero1", "single"]  # nothing applied for the refused request


def ran_steps(events) -> int:
    """The steps the job ran before the script's stop: every rank's last word says the same count."""
    counts = {e.steps for e in events if isinstance(e, RunFinished)}
    assert len(counts) == 1 and 0 < counts.pop() < STEPS, counts
    return next(e.steps for e in events if isinstance(e, RunFinished))


def _one_thread(fn, *args, **kwargs):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as each rank: the same kernels, summing in the same order
    try:
        return fn(*args, **kwargs)
    finally:
        torch.set_num_threads(threads)


# -- from and to every other strategy ----------------------------------------------------------------------------
ZERO = ("zero1", "zero2", "zero3")
OTHERS = ("single", "gather-scatter", "allreduce", "ddp")
PER = 2  # steps per segment


def pairs_circuit() -> list[str]:
    """An Euler circuit (Hierholzer) of every ordered pair with a zero strategy on at least one side: 30 switches,
    each once (every node has as many ways in as out)."""
    edges = {a: [b for b in (*ZERO, *OTHERS) if b != a and (a in ZERO or b in ZERO)] for a in (*ZERO, *OTHERS)}
    stack, circuit = ["ddp"], []
    while stack:
        if edges[stack[-1]]:
            stack.append(edges[stack[-1]].pop())
        else:
            circuit.append(stack.pop())
    return circuit[::-1]


def test_every_switch_to_and_from_a_zero_strategy_keeps_one_model(tmp_path):
    """A sweep through every such pair (31 segments of 2 steps, 2 ranks, FSDP2's default units): rank 0's final
    parameters are one process's training on the same batches, and every segment starts with one fingerprint on
    every rank."""
    path = pairs_circuit()
    switches = {(a, b) for a, b in zip(path, path[1:])}
    assert len(path) == 31 and len(switches) == 30 and all(a in ZERO or b in ZERO for a, b in switches)
    world = 2
    sweep = tuple(SyncConfig(strategy=name, batch_size=4, lr=0.05) for name in path)
    saved = tmp_path / "model.pt"
    cfg = RunConfig(model="tiny", sync=sweep[0], sweep=sweep, sweep_warmup=0, sweep_measure=PER, synthetic_size=480,
                    span_every=3, eval=False, save=str(saved), seed=7, threads=1, profile="pairs")
    mp = pytest.MonkeyPatch()
    mp.setenv("DDPTOP_TEST_MODEL", "no-batch-norm")
    try:
        code, events = run_job(cfg, world_size=world, timeout_s=120)
    finally:
        mp.undo()
    assert code == 0
    state = torch.load(saved, map_location="cpu", weights_only=True)
    applied = [e for e in events if isinstance(e, ConfigApplied)]
    by_segment: dict[int, set] = {}
    for e in applied:
        by_segment.setdefault(e.segment, set()).add((e.step, e.fingerprint))
    assert sorted(by_segment) == list(range(len(path)))
    assert all(len(prints) == 1 for prints in by_segment.values()), by_segment
    reference = _one_thread(_replay, cfg, {e.step: e.config for e in applied if e.rank == 0}, len(path) * PER, world)
    worst = max((a - b).abs().max().item() for a, b in zip(state.values(), reference.parameters()))
    assert worst < TOLERANCE, f"largest parameter difference {worst:.2e} after {len(path) * PER} steps"
