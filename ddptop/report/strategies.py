"""Seed 004's comparison for the data-parallel strategies: strategy × world size, memory per rank, step time and
throughput, from one or more recordings' sweeps (issue 43, item 5)."""

from __future__ import annotations

from ddptop.metrics.memory import held_by_formula
from ddptop.report import markdown

SEED_NOTE = ("Seed 004 (Horovod, DeepSpeed and PyTorch distributed compared) publishes no figures for these axes: "
             "its memory tables are nvidia-smi's GPU memory-usage per Horovod job (PyTorch Lightning on CIFAR-10: "
             "1631 MiB of 12288 MiB, 11% GPU-util), and its throughput figure says only that throughput \"almost "
             "increases linearly with the number of workers from 1 to 4\"; so nothing published stands beside this "
             "table. Held: the largest of any rank's parameters + gradients + optimizer state in its own storage at "
             "its latest sampled step (the *Memory per rank* table); by formula: metrics.memory.held_by_formula for "
             "the run's parameter bytes (SGD with momentum: P + G + O replicated, P + G + O/N under ZeRO-1, "
             "(P + G + O)/N under ZeRO-2 and -3). Peak: the largest of any rank's (GPU: the CUDA allocator's; "
             "CPU: the process's unique memory). s/step: the slowest rank's mean; throughput: every rank's samples "
             "over the slowest rank's time; each pooled over a configuration's segments, weighted by measured steps.")


def blocks(runs: list) -> list[tuple]:
    """The table where a run ran a sharded strategy and sampled memory; nothing otherwise (older reports unchanged)."""
    pooled: dict[tuple[str, int], dict] = {}
    for run in runs:
        memory: dict[int, list] = {}
        for m in run.memory:
            memory.setdefault(m.segment, []).append(m)
        for s in run.segments:
            ranks = memory.get(s.index)
            if not s.measured_steps or not ranks:
                continue
            row = pooled.setdefault((s.config.strategy, s.world_size), {
                "steps": 0, "step_s": 0.0, "rate": 0.0, "held": 0, "peak": 0, "formula": 0, "runs": set()})
            n = s.measured_steps
            row["steps"] += n
            row["step_s"] += n * s.mean_step_s
            row["rate"] += n * s.images_per_s
            row["held"] = max(row["held"], *(m.held_bytes for m in ranks))
            row["peak"] = max(row["peak"], *(m.peak_bytes for m in ranks))
            row["formula"] = max(row["formula"], sum(held_by_formula(s.config.strategy, run.param_bytes,
                                                                     s.world_size)))
            row["runs"].add(run.name)
    if not any(strategy.startswith("zero") for strategy, _ in pooled):
        return []
    rows = [[markdown.untrusted(strategy), str(world), _mb(r["held"]), _mb(r["formula"]), _mb(r["peak"]),
             f"{r['step_s'] / r['steps']:.4f}", f"{r['rate'] / r['steps']:.1f}", str(r["steps"])]
            for (strategy, world), r in sorted(pooled.items(), key=lambda kv: (kv[0][1], _order(kv[0][0])))]
    return [("h2", "Strategies by world size (seed 004)"),
            ("table", ["strategy", "ranks", "held MB/rank", "by formula MB/rank", "peak MB/rank", "s/step",
                       "throughput /s", "measured steps"], rows), ("p", SEED_NOTE)]


def _mb(nbytes: float) -> str:
    return f"{nbytes / 1e6:.2f}"


def _order(strategy: str) -> tuple[int, str]:
    """Replicated strategies first, then ZeRO-1, -2, -3."""
    return (1 if strategy.startswith("zero") else 0, strategy)
