"""The security tests' fixture: one real job per module (security_job.Job)."""

from __future__ import annotations

import os
import signal

import pytest

from security_job import Job


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    job = Job(tmp_path_factory.mktemp("job"))
    yield job
    if job.proc.poll() is None:
        os.killpg(job.proc.pid, signal.SIGKILL)
        job.proc.communicate()
