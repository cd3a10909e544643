"""One recording loaded for a report: its segments' statistics, its time series and where it came from."""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import itertools
import os
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path

from ddptop import metrics
from ddptop.errors import RecordingError, UsageError
from ddptop.events import (FRONT, LogLine, ModelsDiverged, RankJoined, RankShifted, RunFinished, RunStarted,
                           RunState, SystemSample)
from ddptop.metrics.learning import first_flag
from ddptop.metrics.memory import memory_table
from ddptop.record.sqlite import redact
from ddptop.report.markdown import untrusted
from ddptop.report.analysis import SegmentStats, segment_stats, test_accuracy


@dataclass(frozen=True)
class StepPoint:
    """One step over every rank: the loss mean, lowest and highest, and when the last rank finished it."""

    step: int
    segment: int
    t: float
    loss: float
    lo: float
    hi: float


@dataclass
class RunData:
    """What a report shows of one recording."""

    path: str
    label: str
    sha256: str
    size_bytes: int
    model: str
    dataset: str
    world_size: int
    warmup: int
    start: float  # wall clock of the recording's first row
    duration: float
    segments: list[SegmentStats]
    points: list[StepPoint]
    samples: list[SystemSample]
    evals: list[tuple[int, float, float]]  # (step, test accuracy over every rank's shard, test loss)
    provenance: dict
    warnings: list[str] = field(default_factory=list)
    pauses: list[tuple[float, float]] = field(default_factory=list)  # wall clock, as rank 0 saw them
    param_bytes: int = 0
    steps_per_epoch: int = 0
    epoch_images: int = 0
    layers: tuple = ()  # ((layer name, parameter count), ...) from RunStarted: DDP's bucket layout (hints)
    link: dict = field(default_factory=dict)  # the lab's link rate, where the recording has it (meta "link")
    stragglers: dict = field(default_factory=dict)  # segment (None: the whole run) → metrics.stragglers.Stragglers
    predicted: dict = field(default_factory=dict)  # segment → ddptop.record.whatif.best (the exposed hint's saving)
    versus: tuple | None = None  # ddptop.record.whatif.versus: predicted vs measured from advise's segment
    threads: dict = field(default_factory=dict)  # rank → torch's threads (RankJoined): its CPU's plausible ceiling
    memory: list = field(default_factory=list)  # metrics.memory.RankMemory per (segment, rank)
    energy: dict = field(default_factory=dict)  # rank → metrics.energy.RankEnergy as a dict (record.info.energy)
    energy_why: str = ""  # why there is none, where no rank has any

    @property
    def name(self) -> str:
        return self.label or Path(self.path).stem


def load(path: str, warmup: int | None = None, label: str = "") -> RunData:
    """One recording, its steps streamed (memory: the segments' sums and the run's other events, never every step:
    a file of 10^6 steps reports in under 200 MB, see README's Recordings)."""
    from ddptop.record.info import note_incomplete
    from ddptop.record.info import energy as run_energy, stragglers, verdict
    from ddptop.record import whatif
    from ddptop.record.reader import DAMAGE, Recording, damaged

    with Recording.open(path) as rec:
        try:
            events = [_slim(e) for e in rec.events(tables=("events", "system"))]  # not the steps and spans
            config, meta, start, duration = rec.config, rec.meta, rec.start, rec.duration
            incomplete = verdict(rec)
            steps = rec.query("SELECT count(DISTINCT step) FROM steps")[0][0]
            rec.segments()  # the switches' rows: what the reader leaves out of them is said with the rest
        except DAMAGE as exc:
            raise damaged(path, exc) from None
        note_incomplete(rec)
        used = metrics.warmup_for(config) if warmup is None else warmup
        buckets = meta.get("ddp_buckets") if isinstance(meta.get("ddp_buckets"), dict) else {}
        figures = rec.segment_table()  # the what-if model's table (the run's warm-up), filled by the one read below:
        shared = figures.warmup == used  # the statistics' own table too, unless --warmup asked for another
        try:
            stats = segment_stats(events, label=label, warmup=used, run_config=config, buckets=buckets,
                                  steps=rec.step_events() if shared else figures.passing(rec.step_events()),
                                  table=figures if shared else None)
        except RecordingError:
            raise
        except (UsageError, ValueError, OverflowError) as exc:  # values no ddptop wrote (checked where decoded)
            raise RecordingError(f"{path} cannot be reported on: "
                                 f"{str(exc).splitlines()[0] if str(exc) else exc!r}") from None
        points = _points(rec.step_losses(), steps) if stats else []
        late = stragglers(rec)
        memory = memory_table(rec.memory_events())
        energy = run_energy(rec)
        table = figures.segments()
        predicted, versus = whatif.bests(rec, table), whatif.versus(rec, table)
        left_out = rec.left_out_line()  # once every row was read
        if left_out:
            print(f"ddptop report: {path}: {left_out}", file=sys.stderr)
            incomplete.append(left_out + "; the figures and tables leave them out")
    if not stats:
        raise RecordingError(f"{path} holds no training steps to report on")
    started = next((e for e in events if isinstance(e, RunStarted)), None)
    world = stats[0].world_size
    return RunData(
        path=path, label=label, sha256=_sha256(path), size_bytes=os.path.getsize(path),
        model=str(config.get("model", started.model if started else "?")),
        dataset=str(config.get("dataset", started.dataset if started else "?")), world_size=world, warmup=used,
        start=start, duration=duration, segments=stats, points=points,
        samples=[e for e in events if isinstance(e, SystemSample)], evals=test_accuracy(events),
        provenance=provenance(meta, config, start, duration),
        warnings=[f"**Incomplete:** {untrusted(reason)}" for reason in incomplete] + _warnings(events)
        + _loss_warning(points),
        pauses=_pauses(events, start + duration),
        param_bytes=started.param_bytes if started else 0, steps_per_epoch=started.steps_per_epoch if started else 0,
        epoch_images=(started.steps_per_epoch * started.accum * started.batch_size * world) if started else 0,
        layers=started.layers if started else (), link=meta.get("link") if isinstance(meta.get("link"), dict) else {},
        stragglers=late, predicted=predicted, versus=versus, memory=memory,
        energy=energy["energy"], energy_why=energy["energy_why"],
        threads={e.rank: e.threads for e in events if isinstance(e, RankJoined)})


def _slim(event):
    """A system sample with only its job interface's NIC, all a report reads of its NICs (s.nic()): a run of 10^6
    steps has ~50,000 samples, each of ~5 interfaces, ~4 KB in all (200 MB)."""
    if isinstance(event, SystemSample) and len(event.nics) > 1:
        return dataclasses.replace(event, nics=tuple(n for n in event.nics if n.iface == event.job_iface))
    return event


def _sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


# A loss series keeps every step up to SERIES_POINTS steps (every shipped recording: ≤ 1500); a longer one is
# drawn in ~SERIES_BUCKETS buckets of consecutive steps (mean, lowest, highest), its first and last step whole:
# 10^6 steps would be 500,000 points for a 10-inch figure, and ~100 MB
SERIES_POINTS = 4000
SERIES_BUCKETS = 2000


def _points(rows, steps: int) -> list[StepPoint]:
    """The loss per step over every rank, from (step, segment, t, loss) rows by step."""
    per = -(-steps // SERIES_BUCKETS) if steps > SERIES_POINTS else 1
    out: list[StepPoint] = []
    bucket: list[StepPoint] = []
    for step, group in itertools.groupby(rows, key=lambda row: row[0]):
        ds = list(group)
        losses = [d[3] for d in ds]
        point = StepPoint(step, ds[0][1], max(d[2] for d in ds), sum(losses) / len(losses), min(losses),
                          max(losses))
        if per == 1 or not out:
            out.append(point)
            continue
        if bucket and (len(bucket) == per or bucket[0].segment != point.segment):
            out.append(_bucket(bucket))
            bucket = []
        bucket.append(point)
    last = bucket.pop() if bucket else None
    return out + ([_bucket(bucket)] if bucket else []) + ([last] if last else [])


def _bucket(points: list[StepPoint]) -> StepPoint:
    """Consecutive steps of one segment as one point, at their middle step."""
    losses = [p.loss for p in points]
    return StepPoint(points[len(points) // 2].step, points[0].segment, max(p.t for p in points),
                     sum(losses) / len(losses), min(p.lo for p in points), max(p.hi for p in points))


def _pauses(events, end: float) -> list[tuple[float, float]]:
    out, since = [], None
    for e in events:
        if isinstance(e, RunState) and e.rank == 0:
            if e.paused and since is None:
                since = e.t
            elif not e.paused and since is not None:
                out.append((since, e.t))
                since = None
    return out + ([(since, end)] if since is not None else [])


def _warnings(events) -> list[str]:
    """What a reader must know before trusting the figures: models that differ, errors (lost ranks: the verdict)."""
    out = []
    for e in events:
        if isinstance(e, ModelsDiverged):
            out.append(f"**Warning:** {untrusted(e.describe())}; from there on the ranks train different models")
        elif isinstance(e, RunFinished) and e.reason.startswith("error"):
            out.append(f"**Rank {e.rank} ended with an error** after {e.steps} steps: {untrusted(e.reason)}")
        elif isinstance(e, LogLine) and e.level == "error":
            out.append(f"**{'Rank ' + str(e.rank) if e.rank != FRONT else e.who}**: {untrusted(e.message)}")
        elif isinstance(e, RankShifted):  # a change point (metrics.changes): the figures after it are another rank's
            out.append(f"**Rank {e.rank} shifted:** {e.describe()}")
    return out


def _loss_warning(points: list[StepPoint]) -> list[str]:
    """The loss flag (ddptop.metrics.learning, the rule the screen and the headless lines use) on the mean over
    ranks, with what its numbers mean for the step times beside it."""
    flagged = first_flag([(p.step, p.loss) for p in points])
    if flagged is None:
        return []
    step, text = flagged
    return [f"**Training went wrong** (the ranks' mean loss, step {step + 1}): {text}. The step times are still the "
            "hardware's, but no loss or accuracy here says anything about the method (the loss figure)"]


def provenance(meta: dict, config: dict, start: float, duration: float) -> dict:
    """Command, versions, hosts and devices of the run, from the recording's meta (all optional)."""
    argv = meta.get("argv") if isinstance(meta.get("argv"), list) else []
    ranks = meta.get("ranks") if isinstance(meta.get("ranks"), dict) else {}
    versions = meta.get("versions") if isinstance(meta.get("versions"), dict) else {}
    created = meta.get("created")
    when = (datetime.datetime.fromtimestamp(start).strftime("%Y-%m-%d %H:%M:%S")
            if start else (str(created) if created else "?"))
    places = {}
    for rank, r in sorted(ranks.items(), key=lambda kv: int(kv[0]) if str(kv[0]).isdigit() else 0):
        if isinstance(r, dict):
            key = tuple(str(r.get(k, "?")) for k in ("host", "device", "backend", "threads", "torch_version"))
            places.setdefault(key, []).append(str(rank))
    hosts = [f"{host}: rank{'s' if len(rs) > 1 else ''} {', '.join(rs)} ({device}, {backend}, {threads} thread(s), "
             f"torch {torch})" for (host, device, backend, threads, torch), rs in places.items()]
    return {"command": command(argv), "when": when, "duration_s": duration,
            "versions": ", ".join(f"{k} {v}" for k, v in versions.items() if isinstance(v, (str, int, float))),
            "hosts": hosts, "profile": str(config.get("profile", "") or ""), "seed": config.get("seed"),
            "synthetic_size": config.get("synthetic_size") if config.get("dataset") == "synthetic" else None}


def command(argv: list) -> str:
    """The command line as the user typed it: `ddptop ...` for the package's own entry points; a token that an
    older recording kept is not shown."""
    words = redact([str(a) for a in argv])
    if words and (words[0].endswith(("ddptop/__main__.py", "/ddptop")) or words[0] in ("ddptop", "-m")):
        words = ["ddptop", *words[1:]]
    return shlex.join(words) if words else "?"
