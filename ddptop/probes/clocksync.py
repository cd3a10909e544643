"""Each rank's wall clock against rank 0's: a ping-pong over the process group at the run's start and end."""

from __future__ import annotations

from typing import Callable

import torch
import torch.distributed as dist

# 16 round trips per rank after one unmeasured (it waits for the peer to get here): on loopback gloo one takes
# ~0.15-0.3 ms, so the exchange costs a few ms per rank, and on a loaded machine (2 cores, 3 ranks) the shortest
# of 16 is rarely one a scheduler hiccup stretched to ms (that would widen the ±rtt/2 the estimate states)
ROUNDS = 16


def ping_pong(group, rank: int, world_size: int, wall: Callable[[], float],
              rounds: int = ROUNDS) -> tuple[tuple[int, float, float], ...]:
    """Every rank calls this at the same point. Rank 0 returns (rank, offset_s, rtt_s) for every rank (its own
    (0, 0, 0)); the others return ().

    NTP's estimate per round: rank 0 sends at t0 (its clock), the peer reads t1 on receipt and t2 as it answers
    (its clock), rank 0 receives at t3. offset = ((t1 − t0) + (t2 − t3)) / 2 and rtt = (t3 − t0) − (t2 − t1): the
    peer's reads happened between t0 and t3, so the true offset lies within ±rtt/2 of the estimate. The round with
    the shortest rtt is kept (the tightest bound)."""
    buf = torch.zeros(2, dtype=torch.float64)  # 1.7e9 s in a double: steps of 0.24 µs
    if rank != 0:
        for _ in range(rounds + 1):
            dist.recv(buf, src=0, group=group)
            t1 = wall()
            buf[0], buf[1] = t1, wall()
            dist.send(buf, dst=0, group=group)
        return ()
    peers = [(0, 0.0, 0.0)]
    for peer in range(1, world_size):
        best: tuple[float, float] | None = None
        for round_ in range(rounds + 1):
            t0 = wall()
            dist.send(buf, dst=peer, group=group)
            dist.recv(buf, src=peer, group=group)
            t3 = wall()
            t1, t2 = buf.tolist()
            rtt = max(0.0, (t3 - t0) - (t2 - t1))
            if round_ and (best is None or rtt < best[1]):
                best = (((t1 - t0) + (t2 - t3)) / 2, rtt)
        peers.append((peer, *best))
    return tuple(peers)
