"""A job's store and hub served as a front serves them (the salt and the hub's ports in the store's public keys, the
hub with the job's keys), for the tests of the parts that talk over them."""

from __future__ import annotations

import time

import zmq

from ddptop.control import store as stores
from ddptop.control import transport
from ddptop.control.auth import JobKeys
from ddptop.control.hub import Hub
from ddptop.control.session import Session, publish

import ports

SALT = b"a-test-salt-16-b"


def job_keys(token: str, job_id: str) -> JobKeys:
    return JobKeys.from_token(token, job_id, SALT)


def rank_only(job: JobKeys) -> JobKeys:
    """What a rank started without the token holds: the ranks key and the front's public key (share_job_keys)."""
    return JobKeys(job.job_id, job.ranks, job.namespace, b"", transport.server_public(job))


class Served:
    """`port`: the store's (what `ddptop ctl` is given); `hub.endpoints()`: the hub's ports (what the ranks use)."""

    def __init__(self, job: JobKeys, world_size: int = 1, lost_after_s: float = 10.0):
        self.job = job
        self.port = ports.port()
        self.store = stores.serve(self.port)
        self.hub = Hub("127.0.0.1", job, world_size, lost_after_s)
        self.ports = self.hub.endpoints()
        publish(stores.ddptop_view(self.store), SALT, self.ports)

    def session(self, role: str = "ctl", timeout_s: float = 10) -> Session:
        return Session("127.0.0.1", self.ports["ctl"], self.job, role, timeout_s)

    def rank_socket(self, port: int | None = None, **options: int) -> zmq.Socket:
        """A rank's PUSH socket, holding only what a rank without the token holds."""
        return transport.client_socket(zmq.PUSH, rank_only(self.job), "rank",
                                       transport.endpoint("127.0.0.1", port or self.ports["tel"]), **options)

    def events(self, done, timeout_s: float = 20) -> list:
        """What the hub handed to the front's pipeline, until `done(events)` or `timeout_s`."""
        got: list = []
        deadline = time.monotonic() + timeout_s
        while not done(got) and time.monotonic() < deadline:
            got += self.hub.source.poll()
            time.sleep(0.05)
        return got

    def close(self) -> None:
        self.hub.close()
        del self.store


class NoLink:
    """A control agent's sockets never reached (control.agent.Link's shape): for tests that drive rank 0's control
    side by hand, its thread ended (`agent._halt.set()`)."""

    session = None

    def beat(self, rank, body) -> None:
        pass

    def close(self) -> None:
        pass
