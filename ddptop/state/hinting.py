"""The live screen's hints: ddptop.metrics.hints over the segment in force, as the snapshot holds it (pure)."""

from __future__ import annotations

from ddptop.metrics import hints as rules
from ddptop.metrics.buckets import ddp_buckets


def live_inputs(snap) -> rules.Inputs | None:
    """The segment in force, once it has measured steps: its figures from the segment table, each rank's bytes by
    the wire formulas (the NIC readings the screen keeps span the last switch: the report and `info` use the NIC
    per segment), the bucket layout from the run's layer sizes. The link's rate is not known live: no link hint."""
    timed = [s for s in snap.segment_figures if s.slowest.steps]
    if not timed or timed[-1].index != snap.segment:
        return None  # the segment in force has no measured step yet: nothing to say about it
    fig, run = timed[-1], snap.run
    formula = {r: (f.tx_bytes, f.rx_bytes) for r, f in fig.ranks.items() if f.steps}
    strategy, bucket_mb = str(fig.config.get("strategy", "")), float(fig.config.get("bucket_mb", 25.0))
    buckets: tuple[int, ...] = ()
    if run is not None and run.layers and run.param_count and strategy == "ddp":
        buckets = tuple(b.nbytes for b in ddp_buckets(run.layers, run.param_bytes / run.param_count, bucket_mb))
    return rules.Inputs(
        strategy=strategy, bucket_mb=bucket_mb, world_size=snap.world_size, step_s=fig.mean.step_s,
        data_s=fig.mean.data_s, comm_s=fig.mean.comm_s, exposed_comm_s=fig.mean.exposed_comm_s, moved=formula,
        moved_by="formula", formula=formula,
        least_comm_s=min((f.comm_s for f in fig.ranks.values() if f.steps), default=0.0),
        gradient_bytes=run.param_bytes if run else 0,
        buckets=buckets, buckets_by="layout", accum=max(1, int(fig.config.get("accum", 1) or 1)))


def live_hints(snap) -> tuple[rules.Hint, ...]:
    """The hints of `snap` (a state.snapshot.Snapshot, which calls this: no import back)."""
    x = live_inputs(snap)
    return tuple(rules.hints(x)) if x is not None else ()
