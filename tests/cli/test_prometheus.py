"""`--metrics-port` on a real job, and on `ddptop attach` to it: scraped while the job trains, parsed with
prometheus_client's own parser, and every scraped value found again with SQL on the job's recording (sqlite3, not
ddptop's reader). Also: the shipped Grafana dashboard uses only names a real job exposes; a port that another
process holds is one line and exit 4; a port out of range is one line and exit 2.

One job serves every assertion (module fixture): ~20 s of wall time here."""

from __future__ import annotations

import json
import math
import os
import re
import signal
import sqlite3
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

import ports
from ddptop.cli import main

ROOT = Path(__file__).resolve().parents[2]
DDPTOP = [sys.executable, "-m", "ddptop"]
TINY = ["--headless", "--model", "tiny", "--synthetic-size", "640", "--batch-size", "16", "--no-eval",
        "--backend", "gloo"]
DASHBOARD = ROOT / "docs" / "grafana" / "ddptop-dashboard.json"
RECENT = 10  # state.snapshot.RECENT_STEPS: each rank's figures are over its last 10 steps
PHASES = {"data": "data_s", "compute": "compute_s", "comm": "comm_s", "exposed_comm": "exposed_comm_s",
          "ddptop": "own_s"}


def scrape(port: int, path: str = "/metrics") -> tuple[float, float, dict, set] | None:
    """(time before, time after, {(sample name, sorted labels): value}, every family and sample name), or None
    while nothing listens. /metrics.json: the same, read with json."""
    t0 = time.time()
    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10).read().decode()
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return None
    t1 = time.time()
    values, names = {}, set()
    if path.endswith(".json"):
        for name, family in json.loads(text).items():
            names.add(name)
            for s in family["samples"]:
                names.add(s["name"])
                values[(s["name"], tuple(sorted(s["labels"].items())))] = float(s["value"])  # "NaN" too
        return t0, t1, values, names
    for family in text_string_to_metric_families(text):
        names.add(family.name)
        for s in family.samples:
            names.add(s.name)
            values[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return t0, t1, values, names


def value(values: dict, name: str, **labels) -> float | None:
    return next((v for (n, ls), v in values.items() if n == name and all(dict(ls).get(k) == w
                                                                        for k, w in labels.items())), None)


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("prom")
    env = {**os.environ, "DDPTOP_STATE_DIR": str(tmp / "jobs")}
    record, metrics, attached = tmp / "prom.db", ports.port(), ports.port()
    proc = subprocess.Popen(DDPTOP + ["--local", "2", "--steps", "100000", "--log-every", "1000", "--record",
                                      str(record), "--metrics-port", str(metrics), "--metrics-addr", "127.0.0.1",
                                      *TINY], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    out, others = {"record": record, "port": metrics}, []
    try:
        out["scrapes"] = poll(metrics, until=lambda v: (value(v, "ddptop_steps_total") or 0) >= 20, least=4)
        out["json_scrapes"] = poll(metrics, until=lambda v: True, least=3, path="/metrics.json")
        # meanwhile: a second process asks for the port the job holds (refused before any rank or file starts),
        # and `attach` serves the job from a port of its own
        second = subprocess.Popen(DDPTOP + ["--local", "2", "--steps", "3", "--record", str(tmp / "second.db"),
                                            "--metrics-port", str(metrics), *TINY], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True, env=env)
        watcher = subprocess.Popen(DDPTOP + ["attach", "--headless", "--log-every", "1000", "--metrics-port",
                                             str(attached), "--metrics-addr", "127.0.0.1"], stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True, env=env)
        others += [second, watcher]
        out["attach_scrapes"] = poll(attached, until=lambda v: value(v, "ddptop_rank_step_seconds") is not None,
                                     least=2)
        watcher.send_signal(signal.SIGINT)  # detach
        out["attach_code"] = watcher.wait(timeout=30)
        out["second"] = (second.wait(timeout=120), *second.communicate())
        out["second_file"] = (tmp / "second.db").exists()
        proc.send_signal(signal.SIGINT)  # a stop: every rank finishes its step, the recording is closed, exit 0
        _, err = proc.communicate(timeout=60)
        out["code"], out["stderr"] = proc.returncode, err
    finally:
        for p in [proc, *others]:
            if p.poll() is None:
                p.kill()
                p.wait()
    return out


def poll(port: int, until, least: int, deadline_s: float = 120, path: str = "/metrics") -> list:
    """Scrape every 0.25 s until `until(values)`, then `least` more times; every scrape with steps in it."""
    deadline, kept, after = time.monotonic() + deadline_s, [], None
    while time.monotonic() < deadline:
        got = scrape(port, path)
        if got is not None and (value(got[2], "ddptop_steps_total") or 0) > 0:
            kept.append(got)
            if after is None and until(got[2]):
                after = len(kept)
            if after is not None and len(kept) >= after + least:
                return kept
        time.sleep(0.25)
    raise AssertionError(f"port {port}: {len(kept)} scrapes with steps in {deadline_s} s")


# -- the ground truth: the recording, read with SQL -------------------------------------------------------------

def truth(db: sqlite3.Connection, cutoff: float) -> dict:
    """What the front's state held once every batch the recording received up to `cutoff` (its `at`) was applied,
    by the glossary's definitions, computed here from the rows: {(name, labels): value}."""
    steps = db.execute("SELECT rank, step, iter_s, data_s, compute_s, comm_s, exposed_comm_s, own_s, batch_size, "
                       "sampled, loss, comm_bytes, tx_bytes, rx_bytes FROM steps WHERE at <= ? ORDER BY seq",
                       (cutoff,)).fetchall()
    if not steps:
        return {}  # the batches before the first step: no scrape kept here (each has steps) can equal them
    host = db.execute("SELECT host FROM system LIMIT 1").fetchone()[0]
    by_rank: dict[int, list] = {}
    for row in steps:
        by_rank.setdefault(row[0], []).append(row)
    out, means = {}, {}
    for rank, rows in by_rank.items():
        recent = rows[-RECENT:]
        chosen = [r for r in recent if not r[9]] or recent
        n = len(chosen)
        f = {"step_s": sum(r[2] for r in chosen) / n, "time": sum(r[2] for r in chosen),
             "images": sum(r[8] for r in chosen)}
        for i, field in enumerate(("data_s", "compute_s", "comm_s", "exposed_comm_s", "own_s"), start=3):
            f[field] = sum(r[i] for r in chosen) / n
        means[rank] = f
        out[("ddptop_rank_step_seconds", rank)] = f["step_s"]
    for stat, v in spread([f["step_s"] for f in means.values()]).items():
        out[("ddptop_step_seconds", stat)] = v
    for phase, field in PHASES.items():
        for stat, v in spread([f[field] for f in means.values()]).items():
            out[("ddptop_phase_seconds", phase, stat)] = v
    out["ddptop_steps_total"] = max(r[1] for r in steps) + 1
    out["ddptop_samples_per_second"] = sum(f["images"] for f in means.values()) / max(f["time"] for f in means.values())
    newest = {rank: max(rows, key=lambda r: r[1]) for rank, rows in by_rank.items()}
    last = max(r[1] for r in newest.values())
    out["ddptop_loss"] = statistics.fmean(r[10] for r in newest.values() if r[1] == last)
    for i, name in enumerate(("ddptop_comm_bytes_total", "ddptop_tx_bytes_total", "ddptop_rx_bytes_total"), 11):
        out[(name, host)] = sum(r[i] for r in steps)
    sample = db.execute("SELECT job_iface, nics, node_cpu_percent FROM system WHERE rank = 0 AND at <= ? "
                        "ORDER BY seq DESC LIMIT 1", (cutoff,)).fetchone()
    if sample is not None:
        nic = next(n for n in json.loads(sample[1]) if n[0] == sample[0])  # NicStat: iface, rx/tx rate, rx, tx bytes
        out[("ddptop_nic_rx_bytes_total", host)], out[("ddptop_nic_tx_bytes_total", host)] = nic[3], nic[4]
        out[("ddptop_node_cpu_ratio", host)] = sample[2] / 100
    return out


def spread(values: list[float]) -> dict:
    """median, p90 (linear between the two closest, numpy's default) and the largest, computed here by hand."""
    v = sorted(values)
    pos = 0.9 * (len(v) - 1)
    lo = math.floor(pos)
    p90 = v[lo] + (pos - lo) * (v[min(lo + 1, len(v) - 1)] - v[lo])
    return {"median": statistics.median(v), "p90": p90, "worst": v[-1]}


def scraped(values: dict) -> dict:
    """The scraped values in truth()'s keys."""
    out = {}
    for (name, labels), v in values.items():
        ls = dict(labels)
        if name == "ddptop_rank_step_seconds":
            out[(name, int(ls["rank"]))] = v
        elif name == "ddptop_step_seconds":
            out[(name, ls["stat"])] = v
        elif name == "ddptop_phase_seconds" and ls["phase"] in PHASES:
            out[(name, ls["phase"], ls["stat"])] = v
        elif name in ("ddptop_steps_total", "ddptop_samples_per_second", "ddptop_loss"):
            out[name] = v
        elif name in ("ddptop_comm_bytes_total", "ddptop_tx_bytes_total", "ddptop_rx_bytes_total",
                      "ddptop_nic_rx_bytes_total", "ddptop_nic_tx_bytes_total", "ddptop_node_cpu_ratio"):
            out[(name, ls["node"])] = v
    return out


def same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(math.isclose(a[k], b[k], rel_tol=1e-9, abs_tol=1e-12) for k in a)


@pytest.mark.parametrize("path", ["/metrics", "/metrics.json"])
def test_every_scraped_value_is_the_recordings_at_the_moment_of_the_scrape(job, path):
    """Each scrape equals the recording read up to one batch (its `at`), and that batch is no older than the
    newest one the recording had received when the scrape began: nothing stale, nothing made up. The JSON form
    (/metrics.json, for scripts) holds the same series, checked against the same truth."""
    assert job["code"] == 0, job["stderr"]
    assert "Prometheus metrics at http://127.0.0.1:" in job["stderr"]
    scrapes = job["scrapes"] if path == "/metrics" else job["json_scrapes"]
    with sqlite3.connect(job["record"]) as db:
        cutoffs = sorted({at for (at,) in db.execute("SELECT at FROM steps UNION SELECT at FROM system "
                                                     "UNION SELECT at FROM events")})
        recorded = db.execute("SELECT max(step) + 1 FROM steps").fetchone()[0]
        found = []
        for t0, t1, values, _ in scrapes:
            seen = scraped(values)
            # no bound on how late the recording stamped the batch (`at`): a loaded machine wrote it after the scrape
            # (a CI run at -n 2 found no match within 1 s); the values must equal the recording at some batch
            matches = [at for at in cutoffs if same(truth(db, at), seen)]
            if not matches:  # the keys where the scrape and the recording's newest batch before it differ
                near = truth(db, max(at for at in cutoffs if at <= t1))
                assert matches, {k: (seen.get(k), near.get(k)) for k in set(seen) | set(near)
                                 if not same({k: seen.get(k, math.nan)}, {k: near.get(k, math.nan)})}
            before = max((at for at in cutoffs if at <= t0 - 0.05), default=0.0)  # the newest batch as it began
            assert matches[-1] >= before, (t0, matches, before)
            assert seen["ddptop_steps_total"] <= recorded
            found.append(matches[-1])
        assert len(set(found)) >= 3  # the scrapes saw the job move, each time as the recording says
        assert {n for n, _ in scrapes[-1][2]} == {n for n, _ in job["scrapes"][-1][2]}  # both: every sample name
        segment = json.loads(db.execute("SELECT config FROM segments WHERE segment = 0").fetchone()[0])
        started = json.loads(db.execute("SELECT data FROM events WHERE kind = 'run_started'").fetchone()[0])
    info = [dict(ls) for (name, ls) in job["scrapes"][-1][2] if name == "ddptop_job_info"]
    assert info == [{"job": "prom", "model": started["model"], "dataset": started["dataset"], "world_size": "2",
                     "segment": "0", **{k: str(v) for k, v in segment.items()}}]
    ranks = {dict(ls)["rank"] for (name, ls) in job["scrapes"][-1][2] if name == "ddptop_rank_phase_seconds"}
    assert ranks == {"0", "1"}


def test_attach_serves_the_same_job_from_another_process(job):
    assert job["attach_code"] == 0
    with sqlite3.connect(job["record"]) as db:
        recorded = db.execute("SELECT max(step) + 1 FROM steps").fetchone()[0]
        low, high = db.execute("SELECT min(iter_s), max(iter_s) FROM steps WHERE sampled = 0").fetchone()
    for _, _, values, _ in job["attach_scrapes"]:
        assert {dict(ls)["job"] for (_, ls) in values} == {"prom"}  # the run's own label: its recording's name
        assert 0 < value(values, "ddptop_steps_total") <= recorded
    last = job["attach_scrapes"][-1][2]
    assert low <= value(last, "ddptop_step_seconds", stat="median") <= high


def test_the_grafana_dashboard_uses_only_names_a_real_job_exposes(job):
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    exprs += [dashboard["templating"]["list"][1]["query"]["query"]]
    used = {name for e in exprs for name in re.findall(r"\bddptop_[a-z_]+", e)}
    exposed = job["scrapes"][-1][3]
    assert len(used) >= 15 and used <= exposed, sorted(used - exposed)


def test_a_port_another_process_holds_is_one_line_and_exit_4(job):
    code, _, stderr = job["second"]
    assert code == 4 and "Traceback" not in stderr, stderr
    assert stderr.splitlines() == [f"ddptop: --metrics-port {job['port']} on 0.0.0.0: the port is in use "
                                          "(another exporter or job); choose another --metrics-port"]
    assert not job["second_file"]  # refused before the recording was created


@pytest.mark.parametrize("args", [["--metrics-port", "0"], ["--metrics-port", "65536"], ["--metrics-port", "x"],
                                  ["--metrics-addr", "127.0.0.1"], ["attach", "--metrics-port", "70000"],
                                  ["--metrics-port", "9400", "--metrics-addr", " "]])
def test_a_bad_metrics_flag_is_one_line_and_exit_2(args, capsys):
    assert main(args) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "metrics" in err, err
