"""A job's store and channel served as a front serves them (the salt and the channel's port in the store's public
keys, the channel with the job's keys), for the tests of the parts that talk over them."""

from __future__ import annotations

from ddptop.control import store as stores
from ddptop.control.auth import JobKeys
from ddptop.control.channel import ChannelClient, ChannelServer, publish

import ports

SALT = b"a-test-salt-16-b"


def job_keys(token: str, job_id: str) -> JobKeys:
    return JobKeys.from_token(token, job_id, SALT)


class Served:
    """`port`: the store's (what `ddptop ctl` is given); `channel.port`: the channel's (what the ranks use)."""

    def __init__(self, job: JobKeys):
        self.job = job
        self.port = ports.port()
        self.store = stores.serve(self.port)
        self.channel = ChannelServer("127.0.0.1", {b"control": job.control, b"ranks": job.ranks})
        publish(stores.ddptop_view(self.store), SALT, self.channel.port)

    def client(self, timeout_s: float = 10, port: int | None = None, role: bytes = b"control") -> ChannelClient:
        key = self.job.control if role == b"control" else self.job.ranks
        return ChannelClient("127.0.0.1", port or self.channel.port, key, role, timeout_s)

    def close(self) -> None:
        self.channel.close()
        del self.store
