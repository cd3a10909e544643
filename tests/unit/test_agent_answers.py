"""Rank 0's answers to a request: "pending" is written before the request can be applied, never after "applied"."""

from __future__ import annotations

import time

from ddptop.config import SyncConfig
from ddptop.control import keys
from ddptop.control.agent import ControlAgent
from ddptop.control.auth import JobKeys
from ddptop.control.commands import make_request, open_json


class Store:
    """A store where writing an answer lets the training thread reach a step boundary first (what load does)."""

    def __init__(self) -> None:
        self.values: dict[str, bytes] = {}
        self.before_answer = None

    def set(self, key, value) -> None:
        if key.startswith("ctl/resp/") and self.before_answer is not None:
            hook, self.before_answer = self.before_answer, None
            hook()
        self.values[key] = value

    def get(self, key):
        return self.values[key]

    def delete_key(self, key) -> bool:
        return self.values.pop(key, None) is not None

    def check(self, names) -> bool:
        return all(n in self.values for n in names)

    def add(self, key, amount) -> int:
        return 0


def test_applied_is_the_last_answer_even_when_the_step_boundary_comes_between_accepting_and_answering():
    job = JobKeys.from_control(b"k" * 32, "job-1")
    store = Store()
    agent = ControlAgent(0, 1, job, lambda: store, lambda e: None, lambda c: None, SyncConfig(strategy="ddp"))
    try:
        store.values[keys.ctl_request(1)] = make_request(job, 1, "set", {"bucket_mb": 10.0}, "test")
        applied = []

        def boundary() -> None:  # the training thread, while rank 0's control thread writes its first answer
            b = agent.boundary(5)
            if b.decision is not None:
                agent.applied(b.decision, 5, 1)
                applied.append(5)

        store.before_answer = boundary
        agent._take(store, 1)
        boundary()  # the next boundary: the queued request is applied now
        answer = open_json(job.control, keys.ctx_response(job.job_id, 1), store.values[keys.ctl_response(1)], 4096)
        assert applied == [5] and answer["state"] == "applied", answer
    finally:
        agent._halt.set()
        time.sleep(0.1)
