"""Rank 0's decision as it crosses the process group (control/commands.py): plain JSON that names its job and
request, read back with every check and no MAC (issue 41: no file under ddptop/control/ implements one)."""

from __future__ import annotations

import json
import pathlib

import pytest

from ddptop.control.auth import BadValue
from ddptop.control.commands import decision_blob, read_decision

JOB = "ab" * 16
CONFIG = {"strategy": "allreduce", "bucket_mb": 25.0, "async_op": False, "batch_size": 16, "lr": 0.1}


def test_a_decision_reads_back_for_its_own_job_and_request_only():
    blob = decision_blob(JOB, 7, CONFIG, "ctl@host")
    assert json.loads(blob) == {"job": JOB, "request": 7, "config": CONFIG, "who": "ctl@host"}  # JSON, nothing else
    assert read_decision(blob, JOB, 7, 2048) == {"config": CONFIG, "who": "ctl@host"}
    for job, request in ((JOB, 8), ("cd" * 16, 7)):  # a group out of step: refused, never applied
        with pytest.raises(BadValue, match="another"):
            read_decision(blob, job, request, 2048)
    for raw in (b"", b"\xff\xfe", b"[1]", b"x" * 3000, json.dumps({"job": JOB, "request": 7}).encode(),
                json.dumps({"job": JOB, "request": 7, "config": "x", "who": "w"}).encode(),
                json.dumps({"job": JOB, "request": True, "config": CONFIG, "who": "w"}).encode()):
        with pytest.raises(BadValue):
            read_decision(raw, JOB, 7, 2048)


def test_no_file_under_control_computes_a_mac():
    """The one keyed hash left is auth.derive, which makes keys (every role's CURVE key), never a message's tag."""
    control = pathlib.Path(__file__).resolve().parents[2] / "ddptop" / "control"
    users = {p.name for p in control.glob("*.py") if "hmac" in p.read_text()}
    assert users == {"auth.py"}, users
    auth = (control / "auth.py").read_text()
    assert auth.count("hmac.new(") == 1 and "def derive(" in auth and "compare_digest" not in auth
    assert not (control / "handshake.py").exists()
