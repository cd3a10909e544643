"""Provides the Prometheus endpoint (`--metrics-port`): the job's figures, read from the front's state at each scrape.

    Feed ─▶ SharedState ─┐ (a light snapshot per scrape: the figures the screen and the headless lines show)
         └▶ Exporter ────┴▶ prometheus_client's registry ─▶ its HTTP server (a thread of its own) ─▶ GET /metrics

Every figure comes from a light snapshot (SessionState.glance) by ddptop.metrics' definitions (step time and its
parts per rank over the last RECENT_STEPS steps, the job's samples/s, the segment's loss, NIC counters); only totals
that the state does not keep (bytes over every step, lost ranks, telemetry gaps) are summed here, as events pass.
Per-rank series are bounded: the TOP_K slowest ranks and the median, p90 and worst over all ranks, so a 1,024-rank
job makes no more series than an 8-rank one (per node: one set per host). A rank that leaves the top k is absent from
the next scrape: the collector builds every series anew from the snapshot, so nothing stale stays to be removed.
"""

from __future__ import annotations

import re
import threading
from typing import Iterator

from ddptop.events import EventsRefused, RankLost, StepDone, TelemetryGap
from ddptop.front.feed import SharedState
from ddptop.metrics import Figures
from ddptop.metrics.ranks import STATS, spread, top

TOP_K = 8  # ranks with series of their own: the slowest by step time (a 1,024-rank job: 8, not 1,024)
RANK_STATES = ("starting", "running", "paused", "lost", "done", "stopped", "error")  # views.RankView.state
PHASES = {"data": "data_s", "compute": "compute_s", "comm": "comm_s", "exposed_comm": "exposed_comm_s",
          "ddptop": "own_s", "other": "other_s"}  # label → metrics.Figures field (the glossary's words)
LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*\Z")

# The exposed names (counters with their _total, the info metric with its _info), their types and what they say.
# Labels: `job` on every series; `node` (host) on per-node series; `rank` and `node` on the top k ranks' series.
SERIES: dict[str, tuple[str, str]] = {
    "ddptop_job_info": ("info", "the job: model, data set, world size, segment and the configuration in force"),
    "ddptop_steps_total": ("counter", "steps the job has finished (the furthest rank's count, the screen's step)"),
    "ddptop_step_seconds": ("gauge", "step time over ranks (stat: median, p90, worst) of each running rank's mean "
                                     "over its last 10 steps"),
    "ddptop_phase_seconds": ("gauge", "a part of the step over ranks (phase: data, compute, comm, exposed_comm, "
                                      "ddptop, other; stat: median, p90, worst), each rank's mean of its last 10 "
                                      "steps"),
    "ddptop_samples_per_second": ("gauge", "the job's images/s (samples/s): every running rank's samples over the "
                                           "slowest rank's time, last 10 steps"),
    "ddptop_loss": ("gauge", "training loss: mean over ranks at the newest step of the segment in force"),
    "ddptop_ranks": ("gauge", "ranks by state (starting, running, paused, lost, done, stopped, error)"),
    "ddptop_ranks_lost_total": ("counter", "ranks reported lost (no heartbeat, or their process died)"),
    "ddptop_telemetry_gaps_total": ("counter", "gaps in a rank's telemetry the front reported (never silent)"),
    "ddptop_telemetry_missing_batches_total": ("counter", "telemetry batches those gaps lost"),
    "ddptop_events_refused_total": ("counter", "events refused at the door (a field of the wrong type or range)"),
    "ddptop_comm_bytes_total": ("counter", "tensor bytes the node's ranks handed to collectives"),
    "ddptop_tx_bytes_total": ("counter", "bytes the node's ranks put on the wire by the sync algorithm's formula"),
    "ddptop_rx_bytes_total": ("counter", "bytes the node's ranks received by the sync algorithm's formula"),
    "ddptop_nic_tx_bytes_total": ("counter", "bytes the node's job interface sent (the kernel's counter, since the "
                                             "run started)"),
    "ddptop_nic_rx_bytes_total": ("counter", "bytes the node's job interface received (the kernel's counter)"),
    "ddptop_node_cpu_ratio": ("gauge", "the node's CPU busy, 0-1 (of its cgroup quota in `ddptop lab`)"),
    "ddptop_node_gpu_utilization_ratio": ("gauge", "mean GPU utilization of the node's ranks, 0-1 (NVML)"),
    "ddptop_rank_step_seconds": ("gauge", "one of the top k ranks by step time: its mean over its last 10 steps"),
    "ddptop_rank_phase_seconds": ("gauge", "one of the top k ranks: a part of its step (phase as above)"),
    "ddptop_rank_cpu_cores": ("gauge", "one of the top k ranks: its process's CPU, in cores busy"),
    "ddptop_rank_gpu_utilization_ratio": ("gauge", "one of the top k ranks: its GPU utilization, 0-1 (NVML)"),
}


class Totals:
    """What a scrape cannot read from the state: sums over every event since the endpoint started (a Pipeline
    sink). Written on the feed's thread, read on the HTTP server's: under a lock."""

    def __init__(self) -> None:
        self.bytes: dict[int, list[int]] = {}  # rank → [comm, tx, rx]
        self.lost = self.gaps = self.missing = self.refused = 0
        self._lock = threading.Lock()

    def handle(self, events: list) -> None:
        with self._lock:
            for e in events:
                if isinstance(e, StepDone):
                    sums = self.bytes.setdefault(e.rank, [0, 0, 0])
                    sums[0] += e.comm_bytes
                    sums[1] += e.tx_bytes
                    sums[2] += e.rx_bytes
                elif isinstance(e, RankLost):
                    self.lost += 1
                elif isinstance(e, TelemetryGap):
                    self.gaps += 1
                    self.missing += max(1, e.last_seq - e.first_seq + 1)
                elif isinstance(e, EventsRefused):
                    self.refused += e.count

    def copy(self) -> "Totals":
        out = Totals()
        with self._lock:
            out.bytes = {r: list(v) for r, v in self.bytes.items()}
            out.lost, out.gaps, out.missing, out.refused = self.lost, self.gaps, self.missing, self.refused
        return out


class Exporter:
    """The front's sink and prometheus_client's custom collector: `handle` counts as events pass, `collect` builds
    every series from a light snapshot of the state when Prometheus scrapes."""

    def __init__(self, state: SharedState, job: str = "ddptop", k: int = TOP_K):
        self.state, self.job, self.k = state, job, k
        self.totals = Totals()

    def handle(self, events: list) -> None:
        self.totals.handle(events)

    def collect(self) -> Iterator:
        snap, loss = self.state.glance()
        return iter(families(snap, loss, self.totals.copy(), self.job, self.k))


def running_figures(snap) -> dict[int, Figures]:
    """Each running rank that has stepped (Snapshot.running: not lost, not finished): its figures over its last
    RECENT_STEPS steps (Snapshot.recent, what the screen's ranks table shows)."""
    return {r: snap.recent(r) for r in snap.running if snap.history.get(r)}


def stats(by_rank: dict[int, Figures], field: str) -> dict[str, float]:
    return spread(getattr(f, field) for f in by_rank.values() if f.steps)


def top_ranks(by_rank: dict[int, Figures], k: int) -> list[int]:
    return top({r: f.step_s for r, f in by_rank.items() if f.steps}, k)



def _family(name: str, labels: list[str]):
    """An empty family of SERIES[name]: declared in every exposition, samples or not (a CPU job has no GPU series,
    but the name is there, so the dashboard's test sees every name it uses)."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily

    kind, text = SERIES[name]
    if kind == "counter":
        return CounterMetricFamily(name[:-len("_total")], text, labels=labels)
    if kind == "info":
        return InfoMetricFamily(name[:-len("_info")], text, labels=labels)
    return GaugeMetricFamily(name, text, labels=labels)


def families(snap, loss: float, totals: Totals, job: str, k: int = TOP_K) -> list:
    """Every series of SERIES from one (light) snapshot, the segment's loss and the totals: the job's, each
    node's, the top k ranks'."""
    out = {name: _family(name, labels) for name, labels in (
        ("ddptop_job_info", ["job"]), ("ddptop_steps_total", ["job"]), ("ddptop_step_seconds", ["job", "stat"]),
        ("ddptop_phase_seconds", ["job", "phase", "stat"]), ("ddptop_samples_per_second", ["job"]),
        ("ddptop_loss", ["job"]), ("ddptop_ranks", ["job", "state"]), ("ddptop_ranks_lost_total", ["job"]),
        ("ddptop_telemetry_gaps_total", ["job"]), ("ddptop_telemetry_missing_batches_total", ["job"]),
        ("ddptop_events_refused_total", ["job"]))}
    _job(out, snap, loss, totals, job)
    out.update(_nodes(snap, totals, job))
    out.update(_ranks(snap, job, k))
    return list(out.values())


def _job(out: dict, snap, loss: float, totals: Totals, job: str) -> None:
    if snap.run is not None:
        out["ddptop_job_info"].add_metric([job], info_labels(snap))
    out["ddptop_steps_total"].add_metric([job], snap.step)
    by_rank = running_figures(snap)
    for stat, value in stats(by_rank, "step_s").items():
        out["ddptop_step_seconds"].add_metric([job, stat], value)
    for phase, field in PHASES.items():
        for stat, value in stats(by_rank, field).items():
            out["ddptop_phase_seconds"].add_metric([job, phase, stat], value)
    if by_rank:
        out["ddptop_samples_per_second"].add_metric([job], snap.images_per_s)
    if by_rank:  # NaN once a rank's loss is (a diverged model), as the screen shows it
        out["ddptop_loss"].add_metric([job], loss)
    counts = {state: 0 for state in RANK_STATES}
    for view in snap.ranks:
        counts[view.state] = counts.get(view.state, 0) + 1
    for state, n in counts.items():
        out["ddptop_ranks"].add_metric([job, state], n)
    for name, value in (("ddptop_ranks_lost_total", totals.lost), ("ddptop_telemetry_gaps_total", totals.gaps),
                        ("ddptop_telemetry_missing_batches_total", totals.missing),
                        ("ddptop_events_refused_total", totals.refused)):
        out[name].add_metric([job], value)


def info_labels(snap) -> dict[str, str]:
    """The info metric's labels: the run's model, data set and world size, the segment in force and its
    configuration (Snapshot.config: the keys of config.SyncConfig), each value as text."""
    labels = {"model": snap.run.model, "dataset": snap.run.dataset, "world_size": str(snap.world_size),
              "segment": str(snap.segment)}
    for key, value in snap.config.items():
        if LABEL_NAME.match(str(key)) and key not in labels and key != "job":
            labels[str(key)] = str(value)
    return labels


def _nodes(snap, totals: Totals, job: str) -> dict:
    out = {name: _family(name, labels) for name, labels in (
        ("ddptop_comm_bytes_total", ["job", "node"]), ("ddptop_tx_bytes_total", ["job", "node"]),
        ("ddptop_rx_bytes_total", ["job", "node"]), ("ddptop_nic_tx_bytes_total", ["job", "node", "iface"]),
        ("ddptop_nic_rx_bytes_total", ["job", "node", "iface"]), ("ddptop_node_cpu_ratio", ["job", "node"]),
        ("ddptop_node_gpu_utilization_ratio", ["job", "node"]))}
    views = {v.rank: v for v in snap.ranks}
    hosts: dict[str, list[int]] = {}
    for rank in sorted(views):
        hosts.setdefault(views[rank].host, []).append(rank)
    for host, ranks in hosts.items():
        sums = [sum(totals.bytes.get(r, (0, 0, 0))[i] for r in ranks) for i in range(3)]
        for name, value in zip(("ddptop_comm_bytes_total", "ddptop_tx_bytes_total", "ddptop_rx_bytes_total"), sums):
            out[name].add_metric([job, host], value)
        gpus = [views[r].gpu_percent for r in ranks if views[r].gpu_percent is not None]
        if gpus:
            out["ddptop_node_gpu_utilization_ratio"].add_metric([job, host], sum(gpus) / len(gpus) / 100)
    for node in snap.nodes:  # NIC counters and the node's CPU: from the host's reporting rank (state.nodes)
        nic = node.nic()
        if nic is not None:
            out["ddptop_nic_tx_bytes_total"].add_metric([job, node.host, nic.stat.iface], nic.stat.tx_bytes)
            out["ddptop_nic_rx_bytes_total"].add_metric([job, node.host, nic.stat.iface], nic.stat.rx_bytes)
        system = views[node.rank].system if node.rank in views else None
        if system is not None:
            out["ddptop_node_cpu_ratio"].add_metric([job, node.host], system.node_cpu_percent / 100)
    return out


def _ranks(snap, job: str, k: int) -> dict:
    out = {name: _family(name, labels) for name, labels in (
        ("ddptop_rank_step_seconds", ["job", "rank", "node"]),
        ("ddptop_rank_phase_seconds", ["job", "rank", "node", "phase"]),
        ("ddptop_rank_cpu_cores", ["job", "rank", "node"]),
        ("ddptop_rank_gpu_utilization_ratio", ["job", "rank", "node"]))}
    by_rank = running_figures(snap)
    views = {v.rank: v for v in snap.ranks}
    for rank in top_ranks(by_rank, k):
        view, f = views[rank], by_rank[rank]
        labels = [job, str(rank), view.host]
        out["ddptop_rank_step_seconds"].add_metric(labels, f.step_s)
        for phase, field in PHASES.items():
            out["ddptop_rank_phase_seconds"].add_metric([*labels, phase], getattr(f, field))
        if view.system is not None:
            out["ddptop_rank_cpu_cores"].add_metric(labels, view.system.proc_cpu_percent / 100)
        if view.gpu_percent is not None:
            out["ddptop_rank_gpu_utilization_ratio"].add_metric(labels, view.gpu_percent / 100)
    return out


JSON_PATH = "/metrics.json"  # the same series as /metrics, as JSON: for a script without a Prometheus parser


class Endpoint:
    """prometheus_client's own HTTP server on a thread of its own, serving one Exporter at /metrics, and the same
    series as JSON at JSON_PATH (one collect, the same definitions: `as_json`)."""

    def __init__(self, exporter: Exporter, port: int, addr: str = "0.0.0.0"):
        import errno
        import socket

        from prometheus_client import CollectorRegistry, start_http_server

        from ddptop.errors import RendezvousError, UsageError

        self.exporter, self.port, self.addr = exporter, port, addr
        registry = CollectorRegistry()
        registry.register(exporter)
        where = f"--metrics-port {port} on {addr}"
        try:
            self.server, self.thread = start_http_server(port, addr, registry)
            self.server.set_app(_with_json(self.server.get_app(), registry))
        except socket.gaierror as exc:
            raise UsageError(f"--metrics-addr {addr!r} is no address of this machine ({exc.strerror})") from None
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:  # as the store's port in use: exit 4 (docs/reference/exit-codes.md)
                raise RendezvousError(f"{where}: the port is in use (another exporter or job); choose another "
                                      "--metrics-port") from None
            if exc.errno == errno.EACCES:
                raise UsageError(f"{where}: not allowed (ports below 1024 need root)") from None
            raise UsageError(f"{where}: cannot listen there ({exc.strerror})") from None

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def as_json(registry) -> dict:
    """Every series of one collect: {name: {"type", "help", "samples": [{"name", "labels", "value"}]}}. A value that
    is not finite (a diverged loss) is the text Prometheus' own format writes: "NaN", "+Inf" or "-Inf"."""
    import math

    out = {}
    for family in registry.collect():
        samples = [{"name": s.name, "labels": dict(s.labels),
                    "value": s.value if math.isfinite(s.value) else ("NaN" if s.value != s.value else
                                                                     ("+Inf" if s.value > 0 else "-Inf"))}
                   for s in family.samples]
        out[family.name] = {"type": family.type, "help": family.documentation, "samples": samples}
    return out


def _with_json(app, registry):
    """prometheus_client's WSGI app, and JSON_PATH answered from the same registry."""
    import json

    def both(environ, start_response):
        if environ.get("PATH_INFO") != JSON_PATH:
            return app(environ, start_response)
        body = json.dumps(as_json(registry), separators=(",", ":")).encode()
        start_response("200 OK", [("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
        return [body]

    return both


def serve(state: SharedState, port: int | None, addr: str = "0.0.0.0", job: str = "ddptop") -> Endpoint | None:
    """--metrics-port PORT: the endpoint over `state`, listening before any rank starts (a port in use is one line
    and exit 4 before anything else happened); None without a port. Its exporter is a sink of the feed."""
    if not port:
        return None
    import sys

    endpoint = Endpoint(Exporter(state, job), port, addr)
    print(f"ddptop: Prometheus metrics at http://{addr}:{port}/metrics (JSON: {JSON_PATH})"
          + (" (every interface)" if addr in ("0.0.0.0", "::") else ""), file=sys.stderr)
    return endpoint


def job_name(recording: str | None, fallback: str) -> str:
    """The `job` label: the recording's file name less .db (a run and an `attach` to it, which reads `host:/path`,
    say the same), else `fallback` (master:port)."""
    import os

    base = os.path.basename(recording or "")
    return (base[:-3] if base.endswith(".db") else base) or fallback
