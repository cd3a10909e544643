"""Rank 0's control thread wakes the front only as often as it must (issue 42): a few syncs a second while nothing
is under way, not 20. Each sync is a CURVE round trip that costs the rank's threads and the front CPU per second,
which on a millisecond step is CPU per step. Counted at a real hub (the front's sockets) over a real session."""

from __future__ import annotations

import time

from ddptop.config import SyncConfig
from ddptop.control import agent as agents
from ddptop.control.agent import ControlAgent, Link
from ddptop.control.auth import JobKeys
from ddptop.control.hub import Hub

KEYS = JobKeys.from_token("test-token", "0" * 32, b"test-salt-16byte")


def test_an_idle_rank_0_syncs_a_few_times_a_second():
    hub = Hub("127.0.0.1", KEYS, 1)
    agent = ControlAgent(0, 1, KEYS, lambda: Link("127.0.0.1", hub.endpoints(), KEYS, 0), lambda e: None,
                         lambda c: None, SyncConfig(strategy="single"))
    try:
        deadline = time.monotonic() + 60
        while hub.syncs < 2 and time.monotonic() < deadline:  # connected and answered (CURVE handshakes first)
            time.sleep(0.05)
        assert hub.syncs >= 2, "rank 0 never synced with the hub"
        first, t0 = hub.syncs, time.monotonic()
        time.sleep(3.0)
        syncs, elapsed = hub.syncs - first, time.monotonic() - t0
        # at most one per IDLE_POLL_S (+2 for the edges); a slow machine only syncs less. Before: one per 0.05 s.
        assert agents.IDLE_POLL_S >= 0.25
        assert syncs <= elapsed / agents.IDLE_POLL_S + 2, (syncs, elapsed)
        assert hub.status is not None and hub.status["step"] == 0  # the status still goes up while idle
    finally:
        agent.close()
        hub.close()
