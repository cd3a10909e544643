"""Exports of a recording: Chrome trace JSON (Perfetto, chrome://tracing) and CSV tables."""

from __future__ import annotations

import contextlib
import csv
import json
import math
import os
from dataclasses import dataclass
from typing import Iterable, Iterator

from ddptop import metrics
from ddptop.config import SHARDED
from ddptop.errors import UsageError
from ddptop.events import SPAN_KINDS, StepDone, StepSpans, SystemSample
from ddptop.metrics.stragglers import RankClock, clocks
from ddptop.record.reader import Recording
from ddptop.safe import replacing

# Lanes (Chrome trace threads) of each rank, top to bottom; span kinds map onto them.
LANES = ("step", "data", "compute", "wait", "comm", "optimizer")
LANE_OF_KIND = {"data": "data", "fwd": "compute", "bwd": "compute", "wait": "wait", "comm": "comm", "opt": "optimizer"}
SUBLANES = 100  # tid = lane index * SUBLANES + sub-lane: overlapping collectives (async_op) get their own rows
assert set(LANE_OF_KIND) == set(SPAN_KINDS)

STEP_COLUMNS = ("rank", "step", "time", "iter_s", "data_s", "compute_s", "micro_s", "fwd_s", "bwd_s", "opt_s",
                "comm_s", "exposed_comm_s", "overlap", "own_s", "threads_s", "other_s", "loss", "strategy", "bucket_mb", "async_op",
                "batch_size", "accum", "compress", "segment", "epoch", "comm_bytes", "tx_bytes", "rx_bytes",
                "images_per_s", "sampled", "wall_time", "tokens")
SEGMENT_COLUMNS = ("segment", "first_step", "last_step", "strategy", "bucket_mb", "async_op", "batch_size", "lr",
                   "accum", "compress", "lr_warmup_steps", "shard_unit",
                   "warmup", "measured_steps", "sampled_left_out", "slowest_rank", "step_s_slowest",
                   "median_step_s_slowest", "step_s_mean", "images_per_s", "data_s", "compute_s", "micro_s",
                   "comm_s", "exposed_comm_s", "overlap", "ddptop_s", "ddptop_share", "ddptop_threads_s", "other_s",
                   "sent_mb", "recv_mb", "final_loss", "switch_mb", "switch_s", "steps_per_epoch", "epoch_s",
                   "tokens_per_s")
SYSTEM_COLUMNS = ("rank", "time", "host", "cpu_percent", "node_cpu_percent", "mem_rss_bytes", "node_mem_used_bytes",
                  "gpu_util", "gpu_mem_used_bytes", "net_iface", "net_rx_bytes", "net_tx_bytes", "net_rx_rate",
                  "net_tx_rate", "wall_time")


def parse_steps(text: str | None) -> tuple[int | None, int | None]:
    """`A:B` → steps A ≤ step < B (like a Python slice; either side may be left out)."""
    if not text:
        return None, None
    first, sep, stop = text.partition(":")
    try:
        lo = int(first) if first.strip() else None
        hi = int(stop) if stop.strip() else None
    except ValueError:
        lo = hi = -1
        sep = ""
    if not sep or (lo is not None and lo < 0) or (hi is not None and hi < 0) or (None not in (lo, hi) and hi <= lo):
        raise UsageError(f"--steps {text!r}: expected A:B with 0 ≤ A < B (A or B may be left out)")
    return lo, hi


# -- Chrome trace -------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class TraceClock:
    """The trace's one time axis: rank 0's clock, in seconds from the recording's start. Ranks on other hosts keep
    clocks of their own (seconds apart): each rank's times go through its offset and drift to rank 0's as the
    recorded ping-pongs measured them (metrics.stragglers.clocks, ±rtt/2), so the bars of one collective line up.
    A rank never measured (a recording older than the ping-pong) keeps its own clock."""

    origin: float
    ranks: dict[int, RankClock]

    @classmethod
    def of(cls, rec: Recording) -> "TraceClock":
        return cls(rec.start, clocks(rec.clock_syncs()))

    def at(self, rank: int, t: float) -> float:
        """`t` read on `rank`'s clock, as seconds after the start on rank 0's."""
        clock = self.ranks.get(rank)
        return (t if clock is None else clock.to_rank0(t)) - self.origin

    def described(self) -> dict[str, dict]:
        """For the trace's otherData: each measured rank's offset to rank 0 (at the run's start), ± and drift."""
        return {str(rank): {"offset_s": _finite(c.offset_s), "uncertainty_s": _finite(c.uncertainty_s),
                            "drift": _finite(c.drift)} for rank, c in sorted(self.ranks.items())}


def trace_events(rec: Recording, first: int | None = None, stop: int | None = None,
                 clock: TraceClock | None = None) -> Iterator[dict]:
    """`ph: X` events in µs from the recording's start on rank 0's clock (TraceClock); pid = rank, one thread per
    lane; metadata last."""
    clock = clock or TraceClock.of(rec)
    ranks: set[int] = set()
    for done in rec.step_events(first, stop):
        ranks.add(done.rank)
        # the bar spans the step's whole interval, as its spans do; a pause inside it is in args, not in iter_s
        args = {"loss": done.loss, "segment": done.segment, "comm_s": done.comm_s,
                "exposed_comm_s": done.exposed_comm_s, "overlap": done.overlap}
        if done.aside_s > 0:
            args.update(iter_s=done.iter_s, set_aside_s=done.aside_s)
        yield _x(done.rank, 0, f"step {done.step}", clock.at(done.rank, metrics.step_start(done)),
                 done.iter_s + done.aside_s, args)
    used: set[tuple[int, int]] = set()
    for spans in rec.step_events(first, stop, table="spans"):
        ranks.add(spans.rank)
        yield from _span_events(spans, clock, used)
    yield from _segment_marks(rec, first, stop)
    yield from _metadata(rec, ranks, used)


def write_trace(path: str, rec: Recording, first: int | None = None, stop: int | None = None) -> int:
    """Stream the Chrome trace to `path` (a full hour of 8 ranks never sits in memory); returns the event count."""
    count = 0
    clock = TraceClock.of(rec)
    other = {"ddptop_recording": os.path.basename(rec.path), "config": rec.config, "time_axis": "rank 0's clock",
             "clocks": clock.described()}
    with _replacing(path) as f:
        f.write('{"displayTimeUnit":"ms","otherData":' + json.dumps(other) + ',"traceEvents":[\n')
        for event in trace_events(rec, first, stop, clock):
            f.write((",\n" if count else "") + json.dumps(event, separators=(",", ":")))
            count += 1
        f.write("\n]}\n")
    return count


def _x(pid: int, tid: int, name: str, start_s: float, dur_s: float, args: dict | None = None,
       cat: str = "step") -> dict:
    ts, dur = _finite(start_s * 1e6), _finite(max(0.0, dur_s) * 1e6)
    event = {"ph": "X", "pid": pid, "tid": tid, "name": name, "cat": cat, "ts": round(ts or 0.0, 3),
             "dur": round(dur or 0.0, 3)}
    if args:
        event["args"] = {k: _finite(v) if isinstance(v, float) else v for k, v in args.items()}
    return event


def _finite(x: float) -> float | None:
    """JSON has no NaN (a diverged loss) or infinity: those become null."""
    return x if math.isfinite(x) else None


def _span_events(spans: StepSpans, clock: TraceClock, used: set[tuple[int, int]]) -> Iterator[dict]:
    """Spans of one step; spans of a lane that overlap without nesting go to the next free sub-lane."""
    ends: dict[str, list[float]] = {}
    for span in sorted(spans.spans, key=lambda s: s.start_s):
        lane = LANE_OF_KIND.get(span.kind, "compute")
        rows = ends.setdefault(lane, [])
        sub = next((i for i, end in enumerate(rows) if end <= span.start_s + 1e-9), len(rows))
        if sub == len(rows):
            rows.append(0.0)
        rows[sub] = span.end_s
        tid = LANES.index(lane) * SUBLANES + min(sub, SUBLANES - 1)
        used.add((spans.rank, tid))
        args = {"step": spans.step, "segment": spans.segment}
        if span.nbytes:
            args.update(bytes=span.nbytes, tx_bytes=span.tx_bytes, rx_bytes=span.rx_bytes)
        yield _x(spans.rank, tid, span.name, clock.at(spans.rank, spans.t0 + span.start_s), span.dur_s, args,
                 span.kind)


def _segment_marks(rec: Recording, first: int | None, stop: int | None) -> list[dict]:
    marks = []
    for seg in rec.segments():
        if (first is None or seg["step"] >= first) and (stop is None or seg["step"] < stop):
            config = ", ".join(f"{k}={v}" for k, v in seg["config"].items())
            marks.append({"ph": "i", "s": "g", "pid": 0, "tid": 0, "ts": round(seg["t"] * 1e6, 3),
                          "name": f"segment {seg['index']} from step {seg['step']}: {config}"})
    return marks


def _metadata(rec: Recording, ranks: set[int], used: set[tuple[int, int]]) -> list[dict]:
    ranks_meta = rec.meta.get("ranks") if isinstance(rec.meta.get("ranks"), dict) else {}
    out = []
    for rank in sorted(ranks):
        info = ranks_meta.get(str(rank)) if isinstance(ranks_meta.get(str(rank)), dict) else {}
        where = f" ({info['host']}, {info.get('device', '?')})" if isinstance(info.get("host"), str) else ""
        out.append({"ph": "M", "pid": rank, "name": "process_name", "args": {"name": f"rank {rank}{where}"}})
        out.append({"ph": "M", "pid": rank, "name": "process_sort_index", "args": {"sort_index": rank}})
        for tid in sorted({0} | {tid for r, tid in used if r == rank}):
            lane, sub = LANES[tid // SUBLANES], tid % SUBLANES
            name = lane if sub == 0 else f"{lane} #{sub + 1}"
            out.append({"ph": "M", "pid": rank, "tid": tid, "name": "thread_name", "args": {"name": name}})
            out.append({"ph": "M", "pid": rank, "tid": tid, "name": "thread_sort_index", "args": {"sort_index": tid}})
    return out


# -- CSV ----------------------------------------------------------------------------------------------------

def step_rows(rec: Recording, first: int | None = None, stop: int | None = None) -> Iterator[dict]:
    configs = {seg["index"]: seg["config"] for seg in rec.segments()}
    for d in rec.step_events(first, stop):
        assert isinstance(d, StepDone)
        config = configs.get(d.segment, {})
        yield {"rank": d.rank, "step": d.step, "time": _r(d.t - rec.start), "iter_s": d.iter_s, "data_s": d.data_s,
               "compute_s": d.compute_s, "micro_s": d.micro_s, "fwd_s": d.fwd_s, "bwd_s": d.bwd_s, "opt_s": d.opt_s,
               "comm_s": d.comm_s,
               "exposed_comm_s": d.exposed_comm_s, "overlap": d.overlap, "own_s": d.own_s, "threads_s": d.threads_s,
               "other_s": metrics.other_s(d), "loss": d.loss, "strategy": config.get("strategy", ""),
               "bucket_mb": config.get("bucket_mb", ""), "async_op": config.get("async_op", ""),
               "batch_size": d.batch_size, "accum": config.get("accum", 1), "compress": config.get("compress", "none"),
               "segment": d.segment, "epoch": d.epoch, "comm_bytes": d.comm_bytes,
               "tx_bytes": d.tx_bytes, "rx_bytes": d.rx_bytes, "images_per_s": _r(metrics.rate(d.batch_size, d.iter_s)),
               "sampled": int(d.sampled), "wall_time": d.t, "tokens": d.tokens}


def segment_rows(rec: Recording) -> Iterator[dict]:
    """The per-segment table (ddptop.metrics) over the whole file: the numbers `info` and `report` show."""
    for row in metrics.table_rows(rec.segment_figures()):
        config = row.pop("config")
        yield {**row, **{k: config.get(k, "") for k in ("strategy", "bucket_mb", "async_op", "batch_size", "lr")},
               "accum": config.get("accum", 1), "compress": config.get("compress", "none"),
               "lr_warmup_steps": config.get("lr_warmup_steps", 0),
               # FSDP2's unit only where the strategy shards: a ddp segment keeps the unit for the next switch
               # (SyncConfig.changed), which it does not use; "" under zero2/zero3: each top-level block
               "shard_unit": config.get("shard_unit", "") if config.get("strategy") in SHARDED else ""}


def system_rows(rec: Recording, first: int | None = None, stop: int | None = None) -> Iterator[dict]:
    """One row per sample; network bytes are the job interface's totals since the run started."""
    for s in rec.system_events(first, stop):
        assert isinstance(s, SystemSample)
        nic = s.nic()
        gpu = s.gpus[0] if s.gpus else None
        yield {"rank": s.rank, "time": _r(s.t - rec.start), "host": s.host, "cpu_percent": s.proc_cpu_percent,
               "node_cpu_percent": s.node_cpu_percent, "mem_rss_bytes": s.proc_rss_bytes,
               "node_mem_used_bytes": s.node_mem_used_bytes,
               "gpu_util": "" if gpu is None or gpu.util_percent is None else gpu.util_percent,
               "gpu_mem_used_bytes": "" if gpu is None or gpu.mem_used_bytes is None else gpu.mem_used_bytes,
               "net_iface": s.job_iface, "net_rx_bytes": nic.rx_bytes if nic else "",
               "net_tx_bytes": nic.tx_bytes if nic else "", "net_rx_rate": _r(nic.rx_rate) if nic else "",
               "net_tx_rate": _r(nic.tx_rate) if nic else "", "wall_time": s.t}


def _r(x: float) -> float:
    return round(x, 6)


def rate_column(rec: Recording) -> str:
    """images_per_s, or samples_per_s where the recorded run's inputs were not images (metrics.rate_column)."""
    return metrics.rate_column(rec.config.get("dataset"))


def write_csv(path: str, columns: tuple[str, ...], rows: Iterable[dict], rate: str = "images_per_s") -> int:
    """The rows under `columns`, with the images_per_s column named `rate` (rate_column)."""
    count = 0
    with _replacing(path) as f:
        writer = csv.DictWriter(f, fieldnames=[rate if c == "images_per_s" else c for c in columns])
        writer.writeheader()
        for row in rows:
            if rate != "images_per_s" and "images_per_s" in row:
                row[rate] = row.pop("images_per_s")
            writer.writerow(row)
            count += 1
    return count


@contextlib.contextmanager
def _replacing(path: str):
    """Write PATH whole or not at all, through no link planted at it or at a partial (safe.replacing: a fresh file
    beside it, renamed onto PATH when complete): a failed export leaves no half file."""
    try:
        with replacing(path, "w", newline="") as f:
            yield f
    except OSError as exc:
        raise UsageError(f"cannot write {path}: {exc.strerror or exc}") from None
