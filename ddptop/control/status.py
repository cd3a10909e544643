"""Provides what `ddptop ctl status` prints: the job's step and config, and each rank's recent figures, read from
the telemetry the ranks already publish (the newest batches still in the store), by ddptop.metrics."""

from __future__ import annotations

from typing import Any

from ddptop import metrics
from ddptop.control import keys
from ddptop.control.auth import unseal
from ddptop.events import StepDone, decode_events
from ddptop.safe import clean_lines

BATCHES = 3  # newest telemetry batches read per rank: at 4 batches/s, the last ~0.75 s (or the last few steps)
WINDOW = 10


def recent_steps(store, job, world_size: int) -> dict[int, list[StepDone]]:
    """Each rank's StepDone from its newest telemetry batches (what a collector has not deleted), unsealed with the
    job's keys (auth.JobKeys) like the collector does; a head or batch that does not verify is skipped."""
    out: dict[int, list[StepDone]] = {}
    for rank in range(world_size):
        try:
            if not store.check([keys.tel_head(rank)]):
                continue
            head = int(unseal(job.ranks, f"head {job.job_id} {rank}", store.get(keys.tel_head(rank)), 32))
        except (ValueError, OSError):  # BadValue is a ValueError
            continue
        steps: list[StepDone] = []
        for seq in range(max(1, head - BATCHES + 1), head + 1):
            try:
                if store.check([keys.tel_batch(rank, seq)]):
                    blob = unseal(job.ranks, f"tel {job.job_id} {rank} {seq}", store.get(keys.tel_batch(rank, seq)),
                                  keys.MAX_BATCH_BYTES)
                    steps += [e for e in decode_events(blob) if isinstance(e, StepDone)]
            except (ValueError, OSError):  # BadValue and EventDecodeError are ValueErrors
                continue
        out[rank] = steps[-WINDOW:]
    return out


def format_status(status: dict[str, Any], where: str, steps: dict[int, list[StepDone]]) -> str:
    """One line for the job (state, one step number, the config in force), one per rank with its figures."""
    from ddptop import tables

    state = "paused" if status.get("paused") else "running"
    lines = [f"job {where} · {state} · step {status['step']} · segment {status['segment']}: "
             f"{tables.describe(status['config'])}"]
    lines.append(f"  rank  s/step  comm  exposed  ddptop   (means of each rank's newest steps, at most {WINDOW})")
    for rank in status.get("ranks", []):
        r = rank["rank"]
        f = metrics.window(steps.get(r, []))
        if f.steps:
            lines.append(f"  {r:>4}  {f.step_s:6.3f}  {f.share(f.comm_s):4.0%}  {f.exposed_comm_s * 1e3:5.1f} ms  "
                         f"{f.share(f.own_s):5.1%}")
        else:
            lines.append(f"  {r:>4}  (no recent step in the store)")
        if "refused" in rank:
            lines[-1] += f"  (heartbeat refused: {rank['refused']})"
    return clean_lines("\n".join(lines))  # the status was checked by the client; printed text is cleaned all the same
