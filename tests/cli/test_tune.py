"""`tune bucket` and `tune strategy` on real 2-rank gloo jobs (tiny model; DDP, zero1): through `ddptop ctl tune`
and through `--tune`. Everything is checked with SQL on the recording, not by ddptop's functions: the trial segments
(at most 5), every rank switching at the same step, each trial's measurement (the slowest rank's mean step over the
note's steps) and its standard error, its memory per rank, the kept size or strategy the fastest of them (the start
unless a trial beats it by more than NOISE_Z standard errors of the difference, and MIN_GAIN at least) and in force
at the end, and the note's gain."""

from __future__ import annotations

import json
import math
import os
import sqlite3
import statistics
import subprocess
import sys
import threading
import time

import pytest

from ddptop.metrics.tune import MIN_GAIN, NOISE_Z
from jobs import connect, killed_if_left
import ports
from procs import recording_rows, wait_while_running

TOKEN = "test-token-tune-0123456789"


def _job(tmp_path, port: int, *extra: str, env: dict | None = None) -> subprocess.Popen:
    """A headless 2-rank DDP job of the tiny model that runs until stopped; spans every 2nd step, so the what-if
    model fits segment 0 within seconds. `env`: more of the job's environment (a test hook)."""
    argv = [sys.executable, "-m", "ddptop", "--headless", "--local", "2", "--model", "tiny", "--steps", "100000",
            "--span-every", "2", "--log-every", "100000", "--port", str(port), "--token", TOKEN,
            "--record", str(tmp_path / "run.db"), *extra]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
                            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})


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


def _notes(con) -> list[dict]:
    return [json.loads(d) for (d,) in con.execute("SELECT data FROM events WHERE kind = 'tune_note' ORDER BY seq")]


def _tune_segments(con, note: dict, notes: list[dict]) -> dict[int, list]:
    """{segment: [(rank, step, config)]} of the segments the tune of `note` started: every segment after its start up
    to the next tune's start (which is this tune's last segment), or up to another client's first segment."""
    after = [n["start"]["segment"] for n in notes if n["start"]["segment"] > note["start"]["segment"]]
    bound = min(after, default=10 ** 9)
    by_segment: dict[int, list] = {}
    for segment, rank, step, who, config in con.execute(
            """SELECT json_extract(data, '$.segment'), rank, step, json_extract(data, '$.who'),
               json_extract(data, '$.config') FROM events WHERE kind = 'config_applied' AND
               json_extract(data, '$.segment') > ? AND json_extract(data, '$.segment') <= ? ORDER BY 1, 2""",
            (note["start"]["segment"], bound)):
        if not who.startswith("tune@"):
            break
        by_segment.setdefault(segment, []).append((rank, step, json.loads(config)))
    return by_segment


def _memory(con, segment: int, last: int) -> tuple[int, int, int]:
    """(held, lowest peak, highest peak) the tuner may have read for `segment` once steps ..last had come: the most
    any rank held (parameters + gradients + optimizer state, the same in each of its samples of the segment), and
    the largest peak over the samples before `last` against over all of the segment's samples."""
    held = con.execute("""SELECT rank, min(param_bytes + grad_bytes + optim_bytes), max(param_bytes + grad_bytes +
                          optim_bytes) FROM memory WHERE segment = ? GROUP BY rank""", (segment,)).fetchall()
    assert len(held) == 2 and all(lo == hi > 0 for _, lo, hi in held), (segment, held)
    low = con.execute("SELECT max(peak_bytes) FROM memory WHERE segment = ? AND step < ?", (segment, last)).fetchone()
    high = con.execute("SELECT max(peak_bytes) FROM memory WHERE segment = ?", (segment,)).fetchone()
    return max(hi for _, _, hi in held), low[0], high[0]


def check_tune_recording(db, request_id: int | None = None, what: str = "bucket") -> dict:
    """The recording's tune of `what` (the only one, or request `request_id`'s) against SQL; returns the note. Its
    trials vary `what` (bucket: bucket_mb; strategy: the strategy) and nothing else; each one's memory per rank is
    the recording's."""
    key = {"bucket": "bucket_mb", "strategy": "strategy"}[what]
    with sqlite3.connect(db) as con:
        notes = _notes(con)
        mine = [n for n in notes if n.get("what", "bucket") == what and request_id in (None, n["request_id"])]
        assert len(mine) == 1, notes
        note = mine[0]
        assert note["reason"] == "", note
        kept = note["kept_strategy"] if what == "strategy" else note["kept_mb"]
        assert kept, note
        by_segment = _tune_segments(con, note, notes)
        start_config = json.loads(con.execute("SELECT config FROM segments WHERE segment = ?",
                                              (note["start"]["segment"],)).fetchone()[0])
        trials = note["trials"]
        assert 1 <= len(trials) <= 5
        for trial in trials:  # each trial a segment the tuner started, on every rank at one step
            ranks = by_segment[trial["segment"]]
            assert sorted(r for r, _, _ in ranks) == [0, 1], ranks
            assert len({s for _, s, _ in ranks}) == 1, ranks
            for _, _, config in ranks:  # the start's configuration but for `key` (and what a switch turns off)
                assert config[key] == trial[key] and config["strategy"] == trial["strategy"], (trial, config)
                assert {k: v for k, v in config.items() if k not in (key, "async_op", "compress")} == \
                    {k: v for k, v in start_config.items() if k not in (key, "async_op", "compress")}, config
            assert trial["first_step"] == ranks[0][1] + 1  # its warm-up step left out
        measured, spread = {}, {}
        for trial in [note["start"], *trials]:
            sql = _slowest_mean(con, trial["segment"], trial["first_step"], trial["last_step"])
            assert sql == pytest.approx(trial["step_s"], rel=1e-9), trial
            se = _slowest_spread(con, trial["segment"], trial["first_step"], trial["last_step"])
            assert se > 0 and se == pytest.approx(trial["step_se_s"], rel=1e-9), trial
            measured.setdefault(trial[key], sql)
            spread.setdefault(trial[key], se)
            held, low, high = _memory(con, trial["segment"], trial["last_step"])
            assert trial["held_bytes"] == held and low <= trial["peak_bytes"] <= high, (trial, held, low, high)
        start = note["start"][key]
        fastest = min(measured, key=measured.get)
        noise = max(MIN_GAIN * measured[start], NOISE_Z * math.hypot(spread[start], spread[fastest]))
        if measured[start] - measured[fastest] <= noise:  # within the noise: the configuration in force stays
            fastest = start
        assert kept == fastest, (note, measured)
        assert note["gain_s"] == pytest.approx(measured[start] - measured[fastest], rel=1e-9, abs=1e-12)
        last = by_segment[max(by_segment)][0][2]
        assert last[key] == kept  # the kept configuration is the one in force when the tune ended
        extra = len(by_segment) - len(trials)  # a switch back to the kept one, when it is not the last trial's
        assert extra == (0 if kept == trials[-1][key] else 1), (by_segment, note)
    return note


def test_ctl_tune_bucket_keeps_the_fastest_by_sql_refuses_a_second_and_a_set_ends_a_third(tmp_path):
    """One DDP job, three `ctl tune bucket`: the first keeps the fastest trial (SQL on the recording); a second, asked
    while the first runs, is refused in one line; a third, from the size the first kept, is ended by another
    client's `set batch_size=32` while its first trial runs: the tune ends at once (no trial is measured at batch 32
    under a bucket size's label), says so in one line (exit 1) and in its note, and sets the size it started from
    again on top of the user's change, which stays. The set is sent in this process as soon as rank 0's status shows
    the first trial's size: it lands within a step or two, ~60 steps before the tune could end. One job for the
    three (each job's start is most of its cost), as test_zero1_… does for its strategy tunes."""
    port = ports.port()
    db = tmp_path / "run.db"
    with killed_if_left(_job(tmp_path, port, "--strategy", "ddp")) as proc:
        client = connect(port, TOKEN)
        second: list[subprocess.CompletedProcess] = []
        tune = threading.Thread(target=lambda: second.append(_ctl(port, "tune", "bucket")))
        tune.start()
        for line in proc.stdout:  # the first tune's first trial started: it is under way for 2 more trials
            if "asked by tune@" in line:
                break
        refused = _ctl(port, "tune", "bucket", timeout=60)
        tune.join(timeout=300)
        # the third tune starts from the size the first kept, once rank 0's status shows it in force
        kept_mb = wait_while_running("the first tune's note in the recording", lambda: recording_rows(
            db, "SELECT json_extract(data, '$.kept_mb') FROM events WHERE kind = 'tune_note'"), proc)[0][0]
        deadline = time.monotonic() + 60
        while client.status()["config"]["bucket_mb"] != kept_mb:
            assert time.monotonic() < deadline, (kept_mb, client.status()["config"])
            time.sleep(0.1)
        done: list[subprocess.CompletedProcess] = []
        third = threading.Thread(target=lambda: done.append(_ctl(port, "tune", "bucket", "--timeout", "200")))
        third.start()
        deadline = time.monotonic() + 200
        while client.status()["config"]["bucket_mb"] == kept_mb:  # until its first trial runs
            assert time.monotonic() < deadline and third.is_alive(), done
            time.sleep(0.1)
        asked = client.request("set", {"batch_size": 32})
        third.join(timeout=300)
        answer = client.poll(asked)
        out, _ = _stop(proc, port)
    # the first tune, and the second refused while it ran
    assert refused.returncode == 1 and refused.stdout == "", refused
    assert refused.stderr.strip() == "ddptop: refused: a tune is already running (asked by request 1)", refused.stderr
    first = second[0]
    assert first.returncode == 0, first.stderr
    assert first.stdout.startswith("tune bucket: kept ") and len(first.stdout.splitlines()) == 1, first.stdout
    note = check_tune_recording(db, 1)
    assert note["kept_mb"] == kept_mb, (note, kept_mb)
    assert first.stdout.strip() in out  # the job's own printed line says the same
    # the third, ended by the set
    back = f"changed the job during the tune; back on {kept_mb:g} MB"
    assert answer is not None and answer.get("state") == "applied", answer
    said = done[0]
    assert said.returncode == 1 and said.stdout == "" and len(said.stderr.strip().splitlines()) == 1, said
    assert said.stderr.startswith("ddptop: tune bucket stopped: segment ") and "asked by ctl@" in said.stderr and \
        said.stderr.strip().endswith(back), said.stderr
    with sqlite3.connect(db) as con:
        notes = _notes(con)
        segments = {seg: (who, json.loads(config)) for seg, who, config in con.execute(
            """SELECT json_extract(data, '$.segment'), json_extract(data, '$.who'), json_extract(data, '$.config')
               FROM events WHERE kind = 'config_applied' AND rank = 0""")}
        last = con.execute("""SELECT json_extract(data, '$.who'), json_extract(data, '$.config') FROM events
                              WHERE kind = 'config_applied' ORDER BY seq DESC LIMIT 1""").fetchone()
        measured_batches = [con.execute("""SELECT DISTINCT batch_size FROM steps WHERE segment = ? AND step BETWEEN ?
                                           AND ?""", (t["segment"], t["first_step"], t["last_step"])).fetchall()
                            for t in (notes[-1]["trials"] if notes else [])]
    assert [n["kept_mb"] for n in notes] == [kept_mb, 0] and notes[0]["request_id"] == 1, notes
    note = notes[1]
    assert note["reason"].endswith(back), note
    assert said.stderr.strip() == f"ddptop: tune bucket stopped: {note['reason']}"
    start = segments[note["start"]["segment"]][1]
    assert start["batch_size"] == 64 and start["bucket_mb"] == kept_mb, start

    def but_bucket(config):
        return {k: v for k, v in config.items() if k != "bucket_mb"}

    for trial in note["trials"]:  # each measured trial ran the start's configuration but for its bucket size
        who, config = segments[trial["segment"]]
        assert who.startswith("tune@") and but_bucket(config) == but_bucket(start), (trial, config)
    assert all(rows == [(64,)] for rows in measured_batches), measured_batches
    # every segment the third tune started before the user's set ran batch 64; the user's set and the switch back
    # follow
    since = note["start"]["segment"]
    tuned = [(seg, config) for seg, (who, config) in sorted(segments.items()) if who.startswith("tune@") and seg > since]
    users = [seg for seg, (who, config) in segments.items() if who.startswith("ctl@") and config["batch_size"] == 32]
    assert len(users) == 1 and tuned[-1][0] > users[0], (segments, users)
    assert all(c["batch_size"] == 64 for s, c in tuned[:-1]) and all(s < users[0] for s, _ in tuned[:-1]), tuned
    who, config = last[0], json.loads(last[1])
    assert who.startswith("tune@") and config["bucket_mb"] == kept_mb and config["batch_size"] == 32, last


def test_zero1_tunes_buckets_then_the_strategy_and_zero3_or_allreduce_refuse_buckets(tmp_path):
    """One zero1 job (DDP's buckets under ZeroRedundancyOptimizer) for five things: `--tune bucket` at the start tunes
    its buckets as DDP's, every trial staying zero1; then `ctl tune strategy` tries ddp, zero2 and zero3 from it,
    each a segment with its strategy and its memory per rank, and keeps the fastest; a second strategy tune is ended
    by another client's `set batch_size=32` during its first trial and puts the strategy it started from back; then,
    moved to a sharded strategy (or to allreduce), `ctl tune bucket` is refused in one line naming `tune strategy`
    (or `set strategy=ddp`). The tunes are checked by SQL on the recording; 8 steps a trial (a test hook) keep it
    short."""
    port = ports.port()
    with killed_if_left(_job(tmp_path, port, "--strategy", "zero1", "--tune", "bucket",
                             env={"DDPTOP_TEST_FRONT": "tune-steps:8"})) as proc:
        said = []
        for line in proc.stdout:  # the headless line the bucket tune's note prints
            said.append(line)
            if line.startswith("tune bucket:"):
                break
        by_strategy = _ctl(port, "--json", "tune", "strategy")
        answer = json.loads(by_strategy.stdout or "{}")
        kept = answer.get("kept_strategy")
        client, second = connect(port, TOKEN), []
        tune = threading.Thread(target=lambda: second.append(_ctl(port, "tune", "strategy", "--timeout", "200")))
        tune.start()
        deadline = time.monotonic() + 200
        while client.status()["config"]["strategy"] == kept:  # until the second tune's first trial runs
            assert time.monotonic() < deadline and tune.is_alive(), second
            time.sleep(0.1)
        asked = client.request("set", {"batch_size": 32})
        tune.join(timeout=300)
        set_answer = client.poll(asked)
        sharded = "zero2" if kept == "zero3" else "zero3"  # a switch to the strategy in force would be no switch
        refusals = []
        for strategy in (sharded, "allreduce"):
            assert _ctl(port, "set", f"strategy={strategy}", timeout=60).returncode == 0
            refusals.append(_ctl(port, "tune", "bucket", timeout=60))
        out, _ = _stop(proc, port)
    assert said and said[-1].startswith("tune bucket: kept "), said[-5:]
    bucket = check_tune_recording(tmp_path / "run.db", 0)
    assert {t["strategy"] for t in [bucket["start"], *bucket["trials"]]} == {"zero1"}, bucket
    assert by_strategy.returncode == 0, by_strategy.stderr
    line = answer["line"]
    assert line.startswith(f"tune strategy: kept {kept}") and "\n" not in line, line
    assert line in out  # the job's own printed line says the same
    note = check_tune_recording(tmp_path / "run.db", answer["request_id"], "strategy")
    assert note["kept_strategy"] == kept and note["start"]["strategy"] == "zero1", (note, kept)
    assert [t["strategy"] for t in note["trials"]] == ["ddp", "zero2", "zero3"], note
    for trial in [note["start"], *note["trials"]]:  # each trial's step and memory per rank, as the line says them
        assert (f"{trial['strategy']} {trial['step_s'] * 1e3:.1f}±{trial['step_se_s'] * 1e3:.1f} ms, held "
                f"{trial['held_bytes'] / 1e6:.1f} MB, peak {trial['peak_bytes'] / 1e6:.1f} MB") in line
    stopped = second[0]  # the interrupted tune: one line, exit 1, its note, the start's strategy back
    assert stopped.returncode == 1 and stopped.stdout == "", stopped
    assert stopped.stderr.startswith("ddptop: tune strategy stopped: segment ") and "asked by ctl@" in stopped.stderr \
        and stopped.stderr.strip().endswith(f"changed the job during the tune; back on {kept}"), stopped.stderr
    assert set_answer is not None and set_answer.get("state") == "applied", set_answer
    with sqlite3.connect(tmp_path / "run.db") as con:
        ended = [n for n in _notes(con) if n.get("what") == "strategy" and n["reason"]]
        configs = [(who, json.loads(c)) for who, c in con.execute(
            """SELECT json_extract(data, '$.who'), json_extract(data, '$.config') FROM events WHERE kind =
               'config_applied' AND rank = 0 ORDER BY json_extract(data, '$.segment')""")]
    assert len(ended) == 1 and ended[0]["kept_strategy"] == "" and ended[0]["start"]["strategy"] == kept, ended
    assert all(t["strategy"] != kept for t in ended[0]["trials"]), ended  # a trial measured before the set, if any
    back = next(i for i, (who, c) in enumerate(configs) if who.startswith("ctl@") and c["batch_size"] == 32)
    who, config = configs[back + 1]  # the switch back: the tuner's, the user's batch kept
    assert who.startswith("tune@") and config["strategy"] == kept and config["batch_size"] == 32, configs[back:]
    assert [r.returncode for r in refusals] == [1, 1] and [r.stdout for r in refusals] == ["", ""], refusals
    assert refusals[0].stderr.strip() == (f"ddptop: refused: tune bucket tunes DDP's buckets; {sharded} has none "
                                          "(FSDP2 shards by unit): ddptop ctl tune strategy tries ddp, zero1, zero2 "
                                          "and zero3"), refusals[0].stderr
    assert refusals[1].stderr.strip() == ("ddptop: refused: tune bucket tunes DDP's buckets; the job runs allreduce "
                                          "(ddptop ctl set strategy=ddp first)"), refusals[1].stderr


@pytest.mark.parametrize("argv, said", [
    (["--local", "2", "--strategy", "allreduce"],
     "--tune bucket tunes DDP's buckets, not allreduce (add --strategy ddp)"),
    (["--local", "1", "--strategy", "ddp"],
     "--tune bucket needs 2 ranks or more: with 1 there is nothing to communicate"),
    (["--local", "2", "--strategy", "zero3"], "--tune bucket tunes DDP's buckets; zero3 has none (FSDP2 shards by "
     "unit): --tune strategy tries ddp, zero1, zero2 and zero3"),
    (["--local", "2", "--strategy", "single", "--tune", "strategy"],
     "--tune strategy compares strategies that synchronize the ranks, not single (add --strategy ddp)"),
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
    accepted and rank 0's front tunes the job, once. The job is stopped once the tune has said what it kept (~60
    steps: the live fit it waits for comes every 3 s, then the start needs ~9 and each of 3 trials ~10, measured over
    8 steps as in test_zero1_… (a test hook: what is checked here is who tunes, not the trials' length); at 1 thread
    a rank a tiny step takes ~45 ms here); 400 steps is the bound if it never says so."""
    port = str(ports.port())
    common = [sys.executable, "-m", "ddptop", "--headless", "--master", "127.0.0.1", "--port", port, "--world-size",
              "2", "--model", "tiny", "--steps", "400", "--span-every", "2", "--log-every", "100000", "--token", TOKEN,
              "--strategy", "ddp", "--tune", "bucket", "--threads", "1"]  # 2 processes on 2 cores: 1 thread each
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "DDPTOP_TEST_FRONT": "tune-steps:8"}
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
