"""The ranks agree on a switch without a collective at every step (issue 42), and still at the same step.

Two real gloo ranks run only their control agents (no model: nothing but the boundaries), 240 boundaries each.
Counted on each rank, apart from the agent: the broadcasts it made on the control group (torch.distributed's own
`broadcast`, wrapped to count); and at which boundary each rank applied a request that rank 0's control side took
at boundary 100 (as its control thread takes one from the front). Before: a broadcast at every boundary (240 each).
EXCHANGE_EVERY_S is set far above the run so that the gap is MAX_GAP whatever this machine's speed: the counts are
then fixed numbers, not rates."""

from __future__ import annotations

import json

import torch.distributed as dist
import torch.multiprocessing as mp

from ddptop.config import SyncConfig
from ddptop.control import agent as agents
from ddptop.control.agent import ControlAgent
from ddptop.control.auth import JobKeys
from ddptop.control.commands import make_request
from jobchannel import NoLink
import ports

BOUNDARIES = 240
REQUEST_AT = 100  # rank 0 takes a request just before this boundary
WORLD = 2


def _rank(rank: int, port: int, out: str) -> None:
    agents.EXCHANGE_EVERY_S = 1e6  # the gap is MAX_GAP at every measured exchange, however slow the steps
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
    agent = ControlAgent(rank, WORLD, JobKeys.from_control(b"k" * 32, "job-1"), NoLink, lambda e: None,
                         lambda c: None, SyncConfig(strategy="single"))
    agent._halt.set()  # no front: the control thread ends, rank 0's requests are taken below
    broadcasts = []
    real = dist.broadcast

    def counted(tensor, *args, **kwargs):
        broadcasts.append(int(tensor.numel()))
        return real(tensor, *args, **kwargs)

    dist.broadcast = counted
    applied = []
    for boundary in range(BOUNDARIES):
        if rank == 0 and boundary == REQUEST_AT:
            agent._take(1, {**make_request("set", {"batch_size": 8}, "test"), "id": 1})
        b = agent.boundary(boundary)
        if b.decision is not None:
            applied.append((boundary, b.decision.config.batch_size))
            agent.applied(b.decision, boundary, 1)
    dist.broadcast = real
    agent.close()
    with open(f"{out}.{rank}", "w") as f:
        json.dump({"broadcasts": broadcasts, "applied": applied}, f)


def test_the_ranks_exchange_every_max_gap_boundaries_and_switch_at_the_same_one(tmp_path):
    out = str(tmp_path / "rank")
    mp.start_processes(_rank, args=(ports.port(), out), nprocs=WORLD, join=True, start_method="fork")
    ranks = [json.load(open(f"{out}.{r}")) for r in range(WORLD)]
    # the same switch, at the same boundary, on both ranks, within two gaps of the request (one gap to hand it
    # out, one for the broadcast that carries it to be read)
    assert ranks[0]["applied"] == ranks[1]["applied"], ranks
    assert len(ranks[0]["applied"]) == 1 and ranks[0]["applied"][0][1] == 8
    at = ranks[0]["applied"][0][0]
    assert REQUEST_AT <= at <= REQUEST_AT + 2 * agents.MAX_GAP, at
    # the state's broadcasts and the decision's (one, DECISION_BYTES): the same count on both ranks
    state = [[n for n in r["broadcasts"] if n != agents.DECISION_BYTES] for r in ranks]
    assert [len(s) for s in state] == [len(state[0])] * WORLD
    assert [r["broadcasts"].count(agents.DECISION_BYTES) for r in ranks] == [1, 1]
    # one exchange per MAX_GAP boundaries while idle, one per boundary from the request's hand-out until it is
    # applied, and the first three (no step measured yet): 13 here, where the old cadence made 241
    assert BOUNDARIES // agents.MAX_GAP <= len(state[0]) <= BOUNDARIES // agents.MAX_GAP + 8, len(state[0])
