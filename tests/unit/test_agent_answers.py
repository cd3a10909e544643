"""Rank 0's answers to a request: "pending" is sent before the request can be applied, never after "applied"."""

from __future__ import annotations

import time

from ddptop.config import SyncConfig
from ddptop.control.agent import ControlAgent
from ddptop.control.auth import JobKeys
from ddptop.control.commands import make_request
from jobchannel import NoLink


def test_applied_is_the_last_answer_even_when_the_step_boundary_comes_between_accepting_and_answering():
    job = JobKeys.from_control(b"k" * 32, "job-1")
    agent = ControlAgent(0, 1, job, NoLink, lambda e: None, lambda c: None, SyncConfig(strategy="ddp"))
    agent._halt.set()  # the control thread ends: the test is rank 0's control thread
    time.sleep(0.2)
    applied = []
    outbox = agent._outbox

    def boundary() -> None:  # the training thread, while rank 0's control thread sends its first answer
        b = agent.boundary(5)
        if b.decision is not None:
            agent.applied(b.decision, 5, 1)
            applied.append(5)

    original = agent._answer

    def answer(request_id, response):  # sending the first answer lets the training thread reach a boundary (load)
        original(request_id, response)
        if not applied and response.get("state") == "pending":
            boundary()

    agent._answer = answer
    agent._take(1, {**make_request("set", {"bucket_mb": 10.0}, "test"), "id": 1})
    boundary()  # the next boundary: the queued request is applied now
    answers = [response for request_id, response in outbox if request_id == 1]
    assert applied == [5] and answers[-1]["state"] == "applied", answers
