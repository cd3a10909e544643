"""Short, unambiguous names for segments in figures: only what differs between them, the rest said once."""

from __future__ import annotations

from ddptop.report.analysis import SegmentStats


def short_names(stats: list[SegmentStats]) -> list[str]:
    """`gather-scatter`, `ddp 10 MB`, `batch 128`: each segment by what sets it apart from the others shown."""
    labels = {s.label for s in stats}
    batches = {s.config.batch_size for s in stats}
    lrs = {s.config.lr for s in stats}
    strategies = {s.config.strategy for s in stats}
    ddp_buckets = {s.config.bucket_mb for s in stats if s.config.strategy == "ddp"}
    names = []
    for s in stats:
        words = [s.label] if len(labels) > 1 else []
        c = s.config
        if len(strategies) > 1 or not (len(ddp_buckets) > 1 or len(batches) > 1 or len(lrs) > 1):
            words.append(c.strategy + (" async" if c.async_op else ""))
        elif c.async_op:
            words.append("async")
        if c.strategy == "ddp" and len(ddp_buckets) > 1:
            words.append(f"{c.bucket_mb:g} MB")
        if len(batches) > 1:
            words.append(f"batch {c.batch_size}")
        if len(lrs) > 1:
            words.append(f"lr {c.lr:g}")
        if len({s.config.accum for s in stats}) > 1:
            words.append(f"accum {c.accum}")
        if len({s.config.compress for s in stats}) > 1:
            words.append(c.compress)
        names.append(" ".join(words) or c.strategy)
    seen: dict[str, int] = {}
    for name in names:
        seen[name] = seen.get(name, 0) + 1
    return [f"{name} (#{s.index})" if seen[name] > 1 else name for name, s in zip(names, stats)]


def common(stats: list[SegmentStats]) -> str:
    """What every segment shown shares: `2 ranks, batch 32/rank, lr 0.1`."""
    words = []
    strategies = {s.config.strategy + (" async" if s.config.async_op else "") for s in stats}
    if len(strategies) == 1:
        words.append(next(iter(strategies)))
    worlds = {s.world_size for s in stats}
    if len(worlds) == 1:
        words.append(f"{next(iter(worlds))} rank{'s' if next(iter(worlds)) > 1 else ''}")
    batches = {s.config.batch_size for s in stats}
    if len(batches) == 1:
        words.append(f"batch {next(iter(batches))}/rank")
    lrs = {s.config.lr for s in stats}
    if len(lrs) == 1:
        words.append(f"lr {next(iter(lrs)):g}")
    settings = {(s.config.accum, s.config.compress) for s in stats}
    if len(settings) == 1:  # what a step is and what the wire carries: said where they are not the default
        accum, compress = next(iter(settings))
        words += ([f"accum {accum}"] if accum > 1 else []) + ([compress] if compress != "none" else [])
    return ", ".join(words)
