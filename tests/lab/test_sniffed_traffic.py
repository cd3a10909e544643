"""A stranger who captured all traffic between a job's hosts cannot log in to its transport with it (issue 41).

A 2-host lab job (a token, as every lab job) runs while a raw packet socket on the lab's switch captures every frame
that crosses the hosts' cables (tests/sniffing.py: the pcap is kept in the test's folder). Meanwhile its user runs
`ddptop ctl status`, `pause` and `resume` from host 1, so the capture holds the control sessions a stranger would
most like to replay next to rank 1's join and telemetry. Then a stranger on host 1 (tests/stranger.py) replays every
captured ZeroMQ session's client bytes to the front, reading its answers between, and tries each of the front's
sockets with a keypair of its own (a hello for rank 1 among them). What is checked:

- the capture: every ZeroMQ connection greets with CURVE and carries only CURVE's commands and boxes; the token and
  every key of the job (derived here from the token and the public salt, as ddptop does) appear in no frame and no
  reassembled stream, while the public salt and server key, searched the same way, do (the search sees cleartext);
- each replay gets the front's greeting and a WELCOME (the front did read the replayed HELLO), then the front hangs
  up at the replayed INITIATE: no READY, no MESSAGE;
- the stranger's own keys get no answer, no message and no place in the recording; the same calls with the keys the
  token gives are answered (the control);
- the job ends with exit 0, every rank's steps recorded once, in order, and the pause and resume were only the user's.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from zmq.utils import z85

from ddptop.control import transport
from ddptop.control.auth import JobKeys, derive, token_bytes
from labs import LAB_REFUSED, REPO, LabProcess, inodes, leftovers
from sniffing import Sniffer, commands, connections, mechanism, read_pcap

pytestmark = pytest.mark.skipif(bool(LAB_REFUSED), reason=LAB_REFUSED or "labs work")
STEPS = 100000  # stopped by the test (a SIGINT to the lab, as Ctrl-C) once the stranger is done
ARGS = ["--nodes", "2", "--link", "1gbit", "--headless", "--model", "tiny", "--batch-size", "16",
        "--synthetic-size", "1280", "--no-eval", "--log-every", "10", "--steps", str(STEPS)]
# what the stranger waits for any answer (its attempts wait together; the control stops at its answers): the front
# answers its own clients within ~10 ms
WAIT_S = 3.0
CONTROL_WAIT_S = 20.0  # at most: the control ends at its first answers (rank 1 alone publishes 4 batches a second)
CURVE = {"HELLO", "WELCOME", "INITIATE", "READY", "ERROR", "MESSAGE"}  # ZMTP CURVE's only clear words


def on_host(record, node: int, argv: list[str], env: dict | None = None, timeout: float = 60):
    """`argv` on lab host `node`, with nothing of the test's environment but PATH (no token, no test hooks)."""
    namespace = next(n for n in record.namespaces if n.endswith(f"-n{node}"))
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(REPO), **(env or {})}
    return subprocess.run(["ip", "netns", "exec", namespace, *argv], capture_output=True, text=True, timeout=timeout,
                          env=env)


def as_user(record, tmp: Path, job: dict, *op: str):
    """`ddptop ctl OP` from host 1, with the job's token in its environment as the user would have it."""
    done = on_host(record, 1, [sys.executable, "-m", "ddptop", "ctl", *op, "--master", job["master"], "--port",
                               str(job["port"])], env={"DDPTOP_TOKEN": job["token"], "DDPTOP_STATE_DIR": str(tmp)})
    assert done.returncode == 0, (op, done.stdout, done.stderr)
    return done.stdout


def as_stranger(record, tmp: Path, given: dict) -> dict:
    path = tmp / f"stranger-{len(list(tmp.glob('stranger-*')))}.json"
    path.write_text(json.dumps({"wait_s": WAIT_S, **given}))  # the job's token is not in it
    done = on_host(record, 1, [sys.executable, str(REPO / "tests" / "stranger.py"), str(path)])
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def zmq_sessions(frames, store_port: int) -> list:
    """Every captured connection that opens with ZMTP's greeting from both sides, from its SYN on, whole."""
    return [c for c in connections(frames) if c.server[1] != store_port and c.syn and not c.holes
            and mechanism(c.sent("c")) and mechanism(c.sent("s"))]


def secrets_of(token: str, salt: bytes, job_id: str) -> dict[str, bytes]:
    """The token and every key the job derives from it (auth.py, transport.py), each as it could be written."""
    keys = JobKeys.from_token(token, job_id, salt)
    raw = {"token": token_bytes(token), "control key": keys.control, "ranks key": keys.ranks,
           "server secret": derive(keys.control, "curve server")}
    raw.update({f"{role} secret": transport.secret(keys, role) for role in transport.ROLES})
    if len(token) % 2 == 0:
        try:
            raw["token's bytes"] = bytes.fromhex(token)
        except ValueError:
            pass
    forms = {}
    for name, value in raw.items():
        forms[name] = value
        if name != "token":
            forms[f"{name} (hex)"] = value.hex().encode()
            forms[f"{name} (z85)"] = z85.encode(value)
    return forms


def recorded(db: Path, kind: str, count: int, timeout: float = 30) -> None:
    """Wait until the job's recording holds `count` events of `kind` (the front commits about once a second)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as con:
            if con.execute("SELECT count(*) FROM events WHERE kind = ?", (kind,)).fetchone()[0] >= count:
                return
        time.sleep(0.2)
    raise AssertionError(f"the recording never held {count} {kind} events")


def found_in(needle: bytes, frames: list[bytes], streams: list[bytes]) -> bool:
    return any(needle in f for f in frames) or any(needle in s for s in streams)


def test_a_stranger_with_the_whole_capture_cannot_log_in(tmp_path, monkeypatch):
    monkeypatch.setenv("DDPTOP_TEST_MODEL", "sleep-ms=50")  # ~15 steps/s: seconds of training, little to capture
    db, pcap = tmp_path / "job.db", tmp_path / "lab.pcap"
    lab = LabProcess([*ARGS, "--record", str(db)], tmp_path)
    record = lab.record()
    held = inodes(record)
    sniffer = Sniffer(next(n for n in record.namespaces if n.endswith("-sw")), pcap)
    sniffer.start()
    try:
        lab.wait_line(rf"^step \d+/{STEPS}")
        jobs = (json.loads(p.read_text()) for p in (tmp_path / record.tag / "jobs").glob("*.json"))
        job = next(j for j in jobs if "token" in j)  # the job file `ddptop ctl` on node 0 would read
        status = json.loads(as_user(record, tmp_path, job, "status", "--json"))
        # `ctl resume` sends nothing while the status it reads still says running: resume once every rank paused
        assert "accepted by rank 0" in as_user(record, tmp_path, job, "pause")
        recorded(db, "run_state", 2)
        assert "accepted by rank 0" in as_user(record, tmp_path, job, "resume")
        recorded(db, "run_state", 4)
        time.sleep(0.5)  # the last session's close on the wire
        sessions = zmq_sessions(read_pcap(pcap), job["port"])  # what the stranger has: the capture so far
        replays = [[c.server[1], [[w, d.hex() if w == "c" else len(d)] for w, d in c.turns]] for c in sessions]
        attack = as_stranger(record, tmp_path, {"master": job["master"], "port": job["port"], "replays": replays})
        salt = bytes.fromhex(attack["public"]["salt"])
        secrets = secrets_of(job["token"], salt, status["job"])
        control = as_stranger(record, tmp_path, {
            "master": job["master"], "port": job["port"], "replays": [],
            "secrets": {r: secrets[f"{r} secret"].hex() for r in ("ctl", "attach")}, "wait_s": CONTROL_WAIT_S})
        lab.proc.send_signal(signal.SIGINT)  # Ctrl-C: every rank stops at a step boundary, the recording closes
        code = lab.wait(120)
    finally:
        sniffer.stop()
        if lab.proc.poll() is None:  # a failure above: the lab removes itself on SIGTERM
            lab.proc.terminate()
            lab.wait(60)
    print(lab.output)
    assert code == 0, lab.output
    assert leftovers(record, held, tmp_path) == []
    frames = read_pcap(pcap)
    print(f"capture: {len(frames)} frames, {pcap.stat().st_size} bytes in {pcap}, {sniffer.drops} dropped; "
          f"{len(sessions)} ZeroMQ sessions replayed")
    assert sniffer.drops == 0 and len(frames) == sniffer.frames > 0
    check_the_capture(frames, job, attack["public"], secrets, salt)
    check_the_replays(sessions, attack)
    check_the_strangers_keys(attack, control)
    check_the_recording(db, lab.output)


def check_the_capture(frames, job: dict, public: dict, secrets: dict[str, bytes], salt: bytes) -> None:
    every = connections(frames)
    front = {public[n]: n for n in ("tel", "ctl", "pub")}
    ours = [c for c in every if c.server[0] == job["master"] and c.server[1] in front]
    seen = {front[c.server[1]] for c in ours}
    assert seen == {"tel", "ctl", "pub"}, (seen, [(c.client, c.server) for c in every])
    for c in ours:  # every connection to the front's sockets: CURVE from the first byte, no cleartext frame
        for way in ("c", "s"):
            stream = c.sent(way)
            if len(stream) >= 64:
                assert mechanism(stream) == "CURVE", (c.client, c.server, way, stream[:64])
                assert set(n.rstrip("…") for n in commands(stream)) <= CURVE, (c.client, c.server, way)
    users = [c for c in ours if c.syn and "READY" in commands(c.sent("s"))]
    assert {front[c.server[1]] for c in users} >= {"tel", "ctl"}  # rank 1's telemetry and the user's sessions
    assert all("MESSAGE" in commands(c.sent("c")) for c in users)
    streams = [c.sent(w) for c in every for w in ("c", "s")]
    leaked = [name for name, needle in secrets.items() if found_in(needle, frames, streams)]
    assert leaked == [], f"in clear on the wire: {leaked}"
    # the search sees what is in clear: the store's public keys (the salt in hex, the front's public key in z85)
    assert found_in(salt.hex().encode(), frames, streams) and found_in(public["key"].encode(), frames, streams)


def check_the_replays(sessions, attack: dict) -> None:
    front = {attack["public"][n]: n for n in ("tel", "ctl")}
    replayed = [front.get(c.server[1]) for c in sessions]
    assert replayed.count("tel") >= 1 and replayed.count("ctl") >= 3, replayed  # rank 1's, and the user's 3 ctl
    assert len(attack["replays"]) == len(sessions)
    for session, replayed in zip(sessions, attack["replays"]):
        reply = bytes.fromhex(replayed["reply"])
        said = [n.rstrip("…") for n in commands(reply)]
        where = (session.server, replayed["sent"], said)
        print(f"replayed {front.get(session.server[1])} session from {session.client}: {replayed['sent']} of "
              f"{len(session.sent('c'))} client bytes sent, the front said {said} and hung up")
        assert mechanism(reply) == "CURVE" and said[:1] == ["WELCOME"], where  # it reached the front's CURVE
        assert "READY" not in said and "MESSAGE" not in said and replayed["closed"], where
        assert replayed["sent"] < len(session.sent("c")), where  # hung up on before the session's messages


def check_the_strangers_keys(attack: dict, control: dict) -> None:
    for tried in attack["attempts"]:
        print(f"stranger's key, {tried['what']}: handshakes {tried['handshakes']}, replies {tried['replies']}")
        assert tried["replies"] == [] and "succeeded" not in tried["handshakes"], tried
    assert [a["what"] for a in attack["attempts"]] == ["status", "request", "sync", "answer", "hello", "subscribe",
                                                           "push"]
    answered, heard = control["attempts"]
    assert answered["handshakes"] == ["succeeded"] and '"status"' in answered["replies"][0], answered
    assert heard["handshakes"] == ["succeeded"] and heard["replies"], heard


def check_the_recording(db: Path, output: str) -> None:
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    steps: dict[int, list[int]] = {}
    for rank, step in con.execute("SELECT rank, step FROM steps ORDER BY seq"):  # in the order they were recorded
        steps.setdefault(rank, []).append(step)
    done = {r: len(s) for r, s in steps.items()}
    assert sorted(steps) == [0, 1] and all(s == list(range(done[r])) for r, s in steps.items()), steps  # once each
    assert done[0] == done[1] and f"finished: {done[0]} steps on 2 ranks (stopped)" in output, (done, output[-500:])
    kinds = dict(con.execute("SELECT kind, count(*) FROM events GROUP BY kind").fetchall())
    assert kinds.get("run_state") == 4, kinds  # the user's pause and resume, on each rank
    assert not {"telemetry_gap", "events_refused", "control_refused", "rank_lost", "rank_back"} & set(kinds), kinds
    said = [json.loads(d)["message"] for (d,) in con.execute("SELECT data FROM events WHERE kind = 'log'")]
    assert any("refused connections whose key is not one of the job's roles" in m for m in said), said
    assert all("stranger-was-here" not in d for (d,) in con.execute("SELECT data FROM events"))
