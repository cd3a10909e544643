"""The join window of a job with a token: a stranger's hellos and verdicts, in the store or on the front's socket
with a key of his own, neither abort it nor get in."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time

import zmq

import ports
from security_job import stranger
from stranger import Attempt, attempt_all, look
from test_run_cli import DDPTOP, TINY


def wait_listening(port: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)
    raise AssertionError("the master never listened")


def test_forged_hellos_and_verdicts_do_not_abort_a_job_with_a_token():
    """The token also ends in bytes that are not UTF-8 (once a UnicodeEncodeError on the ranks)."""
    port = str(ports.port())
    token = os.fsdecode(b"join-window-\xff\xfe")  # what Python makes of such bytes in argv
    common = ["--master", "127.0.0.1", "--port", port, "--world-size", "2", "--token", token,
              "--timeout", "30", "--steps", "4", *TINY]
    master = subprocess.Popen([os.fsencode(a) for a in DDPTOP + ["--rank", "0", *common]], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    wait_listening(int(port))
    s = stranger(int(port))
    s.set("join/1", "unsigned hello from a stranger")  # once: "rank 1 presented a wrong or no job token", exit 4
    s.set("join/verdict", json.dumps({"ok": False, "error": "FORGED: rank 0 refused this job", "world_size": 2,
                                      "nonces": {}}))
    s.set("pg/0", "a stranger's address")
    front = look("127.0.0.1", int(port))  # the salt, the front's ports and key: public
    hello = {"rank": 1, "world_size": 2, "host": "FORGED", "pid": 1, "nonce": "FORGED"}
    ask = Attempt(zmq.Context.instance(), zmq.DEALER, f"tcp://127.0.0.1:{front['ctl']}", front["key"], None, "hello")
    ask.send(b"1", b"hello", json.dumps({"hello": hello}).encode())
    [tried] = attempt_all([ask], 3.0)
    assert tried["replies"] == [] and "succeeded" not in tried["handshakes"], tried  # ZAP refused his key
    worker = subprocess.run([os.fsencode(a) for a in DDPTOP + ["--rank", "1", *common]], capture_output=True,
                            text=True, timeout=120)
    out, err = master.communicate(timeout=120)
    assert master.returncode == 0 and worker.returncode == 0, err + worker.stderr
    assert "step 4/4 loss" in out and "rank 1 finished 4 steps" in worker.stderr
    assert "FORGED" not in out + err + worker.stderr + worker.stdout
