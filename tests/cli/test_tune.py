"""`tune bucket` on a real 2-rank gloo job (tiny model, DDP): through `ddptop ctl tune bucket` and through
`--tune bucket`. Everything is checked with SQL on the recording, not by ddptop's functions: the trial segments (at
most 5), every rank switching at the same step, each trial's measurement (the slowest rank's mean step over the
note's steps) and its standard error, the kept size the fastest of them (the start unless a trial beats it by more
than NOISE_Z standard errors of the difference, and MIN_GAIN at least) and in force at the end, and the note's gain."""

from __future__ import annotations

import json
import math
import os
import sqlite3
import statistics
import subprocess
import sys
import threading

import pytest

from ddptop.metrics.tune import MIN_GAIN, NOISE_Z
from jobs import connect, killed_if_left
import ports

TOKEN = "test-token-tune-0123456789"


def _job(tmp_path, port: int, *extra: str) -> subprocess.Popen:
    """A headless 2-rank DDP job of the tiny model that runs until stopped; spans every 2nd step, so the what-if
    model fits segment 0 within seconds."""
    argv = [sys.executable, "-m", "ddptop", "--headless", "--local", "2", "--model", "tiny", "--steps", "100000",
            "--span-every", "2", "--log-every", "100000", "--port", str(port), "--token", TOKEN,
            "--record", str(tmp_path / "run.db"), *extra]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})


def _ctl(port: int, *argv: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ddptop", "ctl", "--master", "127.0.0.1", "--port", str(port),
                           "--token", TOKEN, *argv], capture_output=True, text=True, timeout=timeout)


def _stop(proc: subprocess.Popen, port: int) -> tuple[str, str]:
    connect(port, TOKEN).send("stop")
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    return out, err


def _slowest_mean(con, segment: int, first: int, last: int) -> float:
    """The slowest rank's mean iter_s over steps first..last of `segment`, sampled steps left out; every rank must
    have every step of the window."""
    rows = con.execute("""SELECT rank, avg(iter_s), count(DISTINCT step) FROM steps WHERE segment = ? AND step BETWEEN
                          ? AND ? AND sampled = 0 GROUP BY rank""", (segment, first, last)).fetchall()
    counts = con.execute("""SELECT rank, count(DISTINCT step) FROM steps WHERE segment = ? AND step BETWEEN ? AND ?
                            GROUP BY rank""", (segment, first, last)).fetchall()
    assert len(rows) == 2 and all(n == last - first + 1 for _, n in counts), (segment, first, last, counts)
    return max(mean for _, mean, _ in rows)


def _slowest_spread(con, segment: int, first: int, last: int) -> float:
    """The standard error of that mean: the slowest rank's step times' sample standard deviation / √n."""
    per_rank: dict[int, list[float]] = {}
    for rank, it in con.execute("""SELECT rank, iter_s FROM steps WHERE segment = ? AND step BETWEEN ? AND ?
                                   AND sampled = 0 ORDER BY rank, step""", (segment, first, last)):
        per_rank.setdefault(rank, []).append(it)
    slowest = max(per_rank.values(), key=statistics.fmean)
    return statistics.stdev(slowest) / math.sqrt(len(slowest))


def check_tune_recording(db) -> dict:
    """The recording's tune against SQL; returns the note."""
    with sqlite3.connect(db) as con:
        notes = [json.loads(d) for (d,) in con.execute("SELECT data FROM events WHERE kind = 'tune_note'")]
        assert len(notes) == 1, notes
        note = notes[0]
        assert note["reason"] == "" and note["kept_mb"] > 0, note
        switches = con.execute("""SELECT json_extract(data, '$.segment'), rank, step,
                                  json_extract(data, '$.config.bucket_mb') FROM events WHERE kind = 'config_applied'
                                  AND json_extract(data, '$.who') LIKE 'tune@%' ORDER BY 1, 2""").fetchall()
        by_segment: dict[int, list] = {}
        for segment, rank, step, bucket in switches:
            by_segment.setdefault(segment, []).append((rank, step, bucket))
        trials = note["trials"]
        assert 1 <= len(trials) <= 5
        for trial in trials:  # each trial a segment the tuner started, on every rank at one step
            ranks = by_segment[trial["segment"]]
            assert sorted(r for r, _, _ in ranks) == [0, 1], ranks
            assert len({s for _, s, _ in ranks}) == 1 and {b for _, _, b in ranks} == {trial["bucket_mb"]}, ranks
            assert trial["first_step"] == ranks[0][1] + 1  # its warm-up step left out
        measured, spread = {}, {}
        for trial in [note["start"], *trials]:
            sql = _slowest_mean(con, trial["segment"], trial["first_step"], trial["last_step"])
            assert sql == pytest.approx(trial["step_s"], rel=1e-9), trial
            se = _slowest_spread(con, trial["segment"], trial["first_step"], trial["last_step"])
            assert se > 0 and se == pytest.approx(trial["step_se_s"], rel=1e-9), trial
            measured.setdefault(trial["bucket_mb"], sql)
            spread.setdefault(trial["bucket_mb"], se)
        start_mb = note["start"]["bucket_mb"]
        fastest = min(measured, key=measured.get)
        noise = max(MIN_GAIN * measured[start_mb], NOISE_Z * math.hypot(spread[start_mb], spread[fastest]))
        if measured[start_mb] - measured[fastest] <= noise:  # within the noise: the size in force stays
            fastest = start_mb
        assert note["kept_mb"] == fastest, (note, measured)
        assert note["gain_s"] == pytest.approx(measured[start_mb] - measured[fastest], rel=1e-9, abs=1e-12)
        last = con.execute("""SELECT json_extract(data, '$.config.bucket_mb') FROM events WHERE kind = 'config_applied'
                              ORDER BY seq DESC LIMIT 1""").fetchone()[0]
        assert last == note["kept_mb"]  # the kept size is the one in force when the job stopped
        extra = len(by_segment) - len(trials)  # a switch back to the kept size, when it is not the last trial's
        assert extra == (0 if note["kept_mb"] == trials[-1]["bucket_mb"] else 1), (by_segment, note)
    return note


def test_ctl_tune_bucket_keeps_the_fastest_trial_by_sql_and_refuses_a_second_tune(tmp_path):
    port = ports.port()
    with killed_if_left(_job(tmp_path, port, "--strategy", "ddp")) as proc:
        connect(port, TOKEN)
        second: list[subprocess.CompletedProcess] = []
        tune = threading.Thread(target=lambda: second.append(_ctl(port, "tune", "bucket")))
        tune.start()
        for line in proc.stdout:  # the first tune's first trial started: it is under way for 2 more trials
            if "asked by tune@" in line:
                break
        refused = _ctl(port, "tune", "bucket", timeout=60)
        tune.join(timeout=300)
        out, _ = _stop(proc, port)
    assert refused.returncode == 1 and refused.stdout == "", refused
    assert refused.stderr.strip() == "ddptop: refused: a tune is already running (asked by request 1)", refused.stderr
    done = second[0]
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("tune bucket: kept ") and len(done.stdout.splitlines()) == 1, done.stdout
    note = check_tune_recording(tmp_path / "run.db")
    assert note["request_id"] == 1
    assert done.stdout.strip() in out  # the job's own printed line says the same


def test_run_flag_tune_bucket_keeps_the_fastest_trial_by_sql(tmp_path):
    port = ports.port()
    with killed_if_left(_job(tmp_path, port, "--strategy", "ddp", "--tune", "bucket")) as proc:
        said = []
        for line in proc.stdout:  # the headless line the note prints, then stop the job
            said.append(line)
            if line.startswith("tune bucket:"):
                break
        _stop(proc, port)
    assert said and said[-1].startswith("tune bucket: kept "), said[-5:]
    note = check_tune_recording(tmp_path / "run.db")
    assert note["request_id"] == 0


def test_ctl_tune_on_allreduce_is_one_line_and_exit_1(tmp_path):
    port = ports.port()
    with killed_if_left(_job(tmp_path, port, "--strategy", "allreduce")) as proc:
        connect(port, TOKEN)
        refused = _ctl(port, "tune", "bucket", timeout=60)
        _stop(proc, port)
    assert refused.returncode == 1 and refused.stdout == "", refused
    assert refused.stderr.strip() == ("ddptop: refused: tune bucket tunes DDP's buckets; the job runs allreduce "
                                      "(ddptop ctl set strategy=ddp first)")


@pytest.mark.parametrize("argv, said", [
    (["--local", "2", "--strategy", "allreduce"],
     "--tune bucket tunes DDP's buckets, not allreduce (add --strategy ddp)"),
    (["--local", "1", "--strategy", "ddp"],
     "--tune bucket needs 2 ranks or more: with 1 there is nothing to communicate"),
])
def test_run_flag_tune_refusals_are_one_line_and_exit_2(tmp_path, argv, said):
    done = subprocess.run([sys.executable, "-m", "ddptop", "--headless", "--model", "tiny", "--tune", "bucket",
                           "--no-record", *argv], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 2 and done.stderr.strip() == f"ddptop: {said}", done.stderr


def test_a_run_that_ends_during_the_tune_still_records_its_note(tmp_path):
    """50 steps: the start needs ~21 and each trial ~22, so the ranks finish while a trial runs; the tuner is closed
    before the feed's last drain, and its note (stopped, with the trials done) reaches the recording every time."""
    argv = [sys.executable, "-m", "ddptop", "--headless", "--local", "2", "--model", "tiny", "--steps", "50",
            "--span-every", "2", "--strategy", "ddp", "--tune", "bucket", "--token", TOKEN, "--port", str(ports.port()),
            "--record", str(tmp_path / "run.db")]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    with sqlite3.connect(tmp_path / "run.db") as con:
        notes = [json.loads(d) for (d,) in con.execute("SELECT data FROM events WHERE kind = 'tune_note'")]
    assert len(notes) == 1 and notes[0]["kept_mb"] == 0, notes
    assert notes[0]["reason"] == "the run ended during the tune", notes
    assert f"tune bucket stopped after {len(notes[0]['trials'])} trials: the run ended during the tune" in done.stdout


def test_the_same_tune_command_on_every_node_tunes_once_from_rank_0(tmp_path):
    """Several machines by flags take one command each, the same on every node (README): rank 1's `--tune bucket` is
    accepted and rank 0's front tunes the job, once. The job is stopped once the tune has said what it kept (~130
    steps: the start needs ~21, each of 3 trials ~22, and the live fit it waits for comes every 3 s; at 1 thread a
    rank a tiny step takes ~45 ms here); 400 steps is the bound if it never says so."""
    port = str(ports.port())
    common = [sys.executable, "-m", "ddptop", "--headless", "--master", "127.0.0.1", "--port", port, "--world-size",
              "2", "--model", "tiny", "--steps", "400", "--span-every", "2", "--log-every", "100000", "--token", TOKEN,
              "--strategy", "ddp", "--tune", "bucket", "--threads", "1"]  # 2 processes on 2 cores: 1 thread each
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    master = subprocess.Popen([*common, "--rank", "0", "--record", str(tmp_path / "run.db")], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, cwd=tmp_path, env=env)
    with killed_if_left(master):
        worker = subprocess.Popen([*common, "--rank", "1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                  cwd=tmp_path)
        with killed_if_left(worker):
            lines = []
            for line in master.stdout:  # until the tune's line, or the end of the output (400 steps)
                lines.append(line)
                if line.startswith("tune bucket: "):
                    connect(int(port), TOKEN).send("stop")
                    break
            rest, err = master.communicate(timeout=120)
            w_out, w_err = worker.communicate(timeout=120)
    out = "".join(lines) + rest
    assert worker.returncode == 0 and master.returncode == 0, w_err + err
    assert "tune" not in w_out + w_err, w_err
    note = check_tune_recording(tmp_path / "run.db")
    assert note["kept_mb"] > 0 and out.count("tune bucket: kept ") == 1, out


def test_a_set_during_the_tune_ends_it_and_puts_the_start_size_back_by_sql(tmp_path):
    """Another client's `set batch_size=32` while the first trial runs: the tune ends at once (no trial is measured
    at batch 32 under a bucket size's label), says so in one line (exit 1) and in its note, and sets the size it
    started from again on top of the user's change, which stays. The set is sent in this process as soon as the
    first trial's segment is printed: it lands within a step or two, ~60 steps before the tune could end."""
    port = ports.port()
    with killed_if_left(_job(tmp_path, port, "--strategy", "ddp")) as proc:
        client = connect(port, TOKEN)
        done: list[subprocess.CompletedProcess] = []
        tune = threading.Thread(target=lambda: done.append(_ctl(port, "tune", "bucket", "--timeout", "200")))
        tune.start()
        for line in proc.stdout:  # the first trial's segment started
            if "asked by tune@" in line:
                break
        asked = client.request("set", {"batch_size": 32})
        tune.join(timeout=300)
        answer = client.poll(asked)
        _stop(proc, port)
    assert answer is not None and answer.get("state") == "applied", answer
    said = done[0]
    assert said.returncode == 1 and said.stdout == "" and len(said.stderr.strip().splitlines()) == 1, said
    assert said.stderr.startswith("ddptop: tune bucket stopped: segment ") and "asked by ctl@" in said.stderr and \
        said.stderr.strip().endswith("changed the job during the tune; back on 25 MB"), said.stderr
    with sqlite3.connect(tmp_path / "run.db") as con:
        notes = [json.loads(d) for (d,) in con.execute("SELECT data FROM events WHERE kind = 'tune_note'")]
        segments = {seg: (who, json.loads(config)) for seg, who, config in con.execute(
            """SELECT json_extract(data, '$.segment'), json_extract(data, '$.who'), json_extract(data, '$.config')
               FROM events WHERE kind = 'config_applied' AND rank = 0""")}
        last = con.execute("""SELECT json_extract(data, '$.who'), json_extract(data, '$.config') FROM events
                              WHERE kind = 'config_applied' ORDER BY seq DESC LIMIT 1""").fetchone()
        measured_batches = [con.execute("""SELECT DISTINCT batch_size FROM steps WHERE segment = ? AND step BETWEEN ?
                                           AND ?""", (t["segment"], t["first_step"], t["last_step"])).fetchall()
                            for t in (notes[0]["trials"] if notes else [])]
    assert len(notes) == 1 and notes[0]["kept_mb"] == 0, notes
    note = notes[0]
    assert note["reason"].endswith("changed the job during the tune; back on 25 MB"), note
    assert said.stderr.strip() == f"ddptop: tune bucket stopped: {note['reason']}"
    start = segments[note["start"]["segment"]][1]
    assert start["batch_size"] == 64 and start["bucket_mb"] == 25.0, start

    def but_bucket(config):
        return {k: v for k, v in config.items() if k != "bucket_mb"}

    for trial in note["trials"]:  # each measured trial ran the start's configuration but for its bucket size
        who, config = segments[trial["segment"]]
        assert who.startswith("tune@") and but_bucket(config) == but_bucket(start), (trial, config)
    assert all(rows == [(64,)] for rows in measured_batches), measured_batches
    # every segment the tune started before the user's set ran batch 64; the user's set and the switch back follow
    tuned = [(seg, config) for seg, (who, config) in sorted(segments.items()) if who.startswith("tune@")]
    users = [seg for seg, (who, config) in segments.items() if who.startswith("ctl@") and config["batch_size"] == 32]
    assert len(users) == 1 and tuned[-1][0] > users[0], (segments, users)
    assert all(c["batch_size"] == 64 for s, c in tuned[:-1]) and all(s < users[0] for s, _ in tuned[:-1]), tuned
    who, config = last[0], json.loads(last[1])
    assert who.startswith("tune@") and config["bucket_mb"] == 25.0 and config["batch_size"] == 32, last
