"""Test hooks, for the test suite only: the one module of ddptop that reads a DDPTOP_TEST_* variable.

The suite sets these in a job's environment to give it a fault of known size (a straggling rank, a clock that is
off, a slow forward pass, an out-of-memory batch, a front slow to tear down), so that what ddptop reports can be
checked against it. Unset, as in every real run, each reads as "no hook". Product code imports the parsed values
from here and never names a variable itself (tests/unit/test_testhooks.py holds it to that). No torch: the front
reads its hook without the training stack.

- DDPTOP_TEST_RANK="straggle=1:40,from=1:60,clock=2:5,start=0:3000,join=0:3000,pg=0:3000" (`rank_hooks`)
- DDPTOP_TEST_MODEL="no-batch-norm,sleep-ms=40,data-sleep-ms=5,oom-batch=64,oom-rank=1" (`model_tweaks`)
- DDPTOP_TEST_FRONT="teardown:MS" (`teardown_hold_s`), or "tune-steps:N" (`tune_steps`)
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from ddptop.errors import UsageError

PREFIX = "DDPTOP_TEST_"
RANK_ENV, MODEL_ENV, FRONT_ENV = PREFIX + "RANK", PREFIX + "MODEL", PREFIX + "FRONT"
_RANK_FORMS = "(straggle=RANK:MS, from=RANK:STEP, clock=RANK:SECONDS, start=RANK:MS, join=RANK:MS, pg=RANK:MS)"
_MODEL_FORMS = "(no-batch-norm, sleep-ms=N, data-sleep-ms=N, oom-batch=N, oom-rank=R)"


@dataclass(frozen=True)
class RankHooks:
    delay_s: float = 0.0  # slept before each collective this rank starts (its arrival comes that much later)
    clock_offset_s: float = 0.0  # added to this rank's wall clock (step and span times, its ping-pong answers)
    start_s: float = 0.0  # slept before its first step (a slow start: a Ctrl-C before any step can be aimed at)
    join_s: float = 0.0  # slept before a local rank joins the job (a Ctrl-C while the ranks start can be aimed at)
    delay_from: int = 0  # the straggle starts at this step (a rank that becomes slow mid-run: a change point)
    pg_s: float = 0.0  # slept after the join, before the process group starts (a stranger's window on torch's keys)


def rank_hooks(rank: int, value: str | None = None) -> RankHooks:
    """DDPTOP_TEST_RANK="straggle=1:40,clock=2:5,start=0:3000": rank 1 sleeps 40 ms before each collective, rank 2's
    wall clock reads 5 s ahead, rank 0 sleeps 3 s before its first step; `join=0:3000`: before it joins;
    `from=1:60`: rank 1's straggle starts at step 60 (before it, none); `pg=0:3000`: after the join, before the
    process group starts. Unset: no hook."""
    value = os.environ.get(RANK_ENV, "") if value is None else value
    delay = offset = start = join = pg = 0.0
    delay_from = 0
    for item in filter(None, (x.strip() for x in value.split(","))):
        key, _, rest = item.partition("=")
        who, _, amount = rest.partition(":")
        try:
            who_rank, number = int(who), float(amount)
        except ValueError:
            raise UsageError(f"{RANK_ENV}: bad item {item!r} {_RANK_FORMS}") from None
        if key not in ("straggle", "from", "clock", "start", "join", "pg") or (key == "from" and not number.is_integer()):
            raise UsageError(f"{RANK_ENV}: unknown item {item!r} {_RANK_FORMS}")
        if who_rank == rank and key == "straggle":
            delay = number / 1000.0
        elif who_rank == rank and key == "start":
            start = number / 1000.0
        elif who_rank == rank and key == "join":
            join = number / 1000.0
        elif who_rank == rank and key == "pg":
            pg = number / 1000.0
        elif who_rank == rank and key == "from":
            delay_from = int(number)
        elif who_rank == rank:
            offset = number
    return RankHooks(delay, offset, start, join, delay_from, pg)


def model_tweaks(rank: int | None = None) -> dict:
    """Model and data changes from DDPTOP_TEST_MODEL (comma-separated), as keyword arguments of the build
    (train.specs.build): "no-batch-norm" (BN statistics are per rank: `batch_norm`), "sleep-ms=40" (a forward pass
    of known extra length: `sleep_s`, models.SleepBefore), "data-sleep-ms=5" (each training item takes that much
    longer to load: `data_sleep_s`, data.SlowItems), "oom-batch=64" with optional "oom-rank=1" (that rank's forward
    raises CUDA out-of-memory from batch 64 on, models.OutOfMemoryAt; every rank without oom-rank)."""
    out: dict = {}
    oom_rank = None
    for item in filter(None, (x.strip() for x in os.environ.get(MODEL_ENV, "").split(","))):
        key, _, value = item.partition("=")
        if key == "no-batch-norm":
            out["batch_norm"] = False
        elif key == "sleep-ms":
            out["sleep_s"] = float(value) / 1000.0
        elif key == "data-sleep-ms":
            out["data_sleep_s"] = float(value) / 1000.0
        elif key == "oom-batch":
            out["oom_batch"] = int(value)
        elif key == "oom-rank":
            oom_rank = int(value)
        else:
            raise UsageError(f"{MODEL_ENV}: unknown item {item!r} {_MODEL_FORMS}")
    if oom_rank is not None and rank is not None and rank != oom_rank and "oom_batch" in out:
        # the other ranks wrap their model too, never raising: one model structure (and parameter names) on every
        # rank, which the handshake checks
        out["oom_batch"] = 2**62
    return out


def teardown_hold_s() -> float:
    """DDPTOP_TEST_FRONT="teardown:MS": the front waits that long before tearing its job down, so that a test can
    aim a Ctrl-C at the teardown. 0 otherwise."""
    key, _, ms = os.environ.get(FRONT_ENV, "").partition(":")
    try:
        return float(ms) / 1000.0 if key == "teardown" else 0.0
    except ValueError:
        return 0.0


def tune_steps() -> int:
    """DDPTOP_TEST_FRONT="tune-steps:N": the front's tuner measures each trial over N steps (a short test of several
    tunes on one job). 0 otherwise: metrics.tune.STEPS."""
    key, _, n = os.environ.get(FRONT_ENV, "").partition(":")
    try:
        return max(0, int(n)) if key == "tune-steps" else 0
    except ValueError:
        return 0


def carried() -> tuple[tuple[str, str], ...]:
    """This process's DDPTOP_TEST_* variables, for the local ranks it starts: a rank forked from a server the
    process started earlier (front/forks.py; in the suite, a server left by an earlier job of the same pytest
    process) has that server's environment, not the one a test set since."""
    return tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith(PREFIX)))


def adopt(pairs: tuple[tuple[str, str], ...]) -> None:
    """In a local rank: exactly the starting process's DDPTOP_TEST_* variables (see carried)."""
    for key in [k for k in os.environ if k.startswith(PREFIX)]:
        del os.environ[key]
    os.environ.update(dict(pairs))
