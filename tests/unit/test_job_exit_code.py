"""The front's exit code when one rank fails and the front terminates the others (README: exit codes). Before, the
first non-zero code in rank order won: rank 1 failed its handshake (exit 4), the front terminated rank 0 (SIGTERM),
and the job exited with -15 (status 241) while naming rank 0 `killed by signal 15` first. Real processes."""

from __future__ import annotations

import multiprocessing
import os
import signal
import time

from ddptop.front.supervisor import LocalJob

CTX = multiprocessing.get_context("fork")


def _exit_with(code: int) -> None:
    os._exit(code)


def _train() -> None:
    time.sleep(120)


def _ranks(*targets) -> LocalJob:
    procs = [CTX.Process(target=t, args=a) for t, *a in targets]
    for p in procs:
        p.start()
    return LocalJob(procs, list(range(len(procs))))


def _until_ended(job: LocalJob, rank: int) -> None:
    deadline = time.monotonic() + 30
    while job.codes()[rank] is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert job.codes()[rank] is not None


def test_a_rank_that_fails_gives_its_own_code_though_the_front_terminated_rank_0():
    job = _ranks((_train,), (_exit_with, 4))
    _until_ended(job, 1)
    job.terminate()  # what check() does GRACE_S after the first failure
    assert job.codes() == [-signal.SIGTERM, 4]
    assert job.exit_code() == 4
    lost = job.lost_events()
    assert [e.rank for e in lost] == [1] and "exited with code 4" in lost[0].reason, lost
    failed, why = job.outcome()
    assert failed and why.startswith("rank 1 ") and "signal" not in why, why


def test_a_rank_killed_by_someone_else_is_a_peer_lost_exit_5_never_a_negative_status():
    job = _ranks((_train,), (_train,))
    job.procs[1].kill()  # the OOM killer, a user's kill -9: not the front's own signal
    _until_ended(job, 1)
    job.terminate()
    assert job.codes() == [-signal.SIGTERM, -signal.SIGKILL]
    assert job.exit_code() == 5
    assert [(e.rank, "killed by signal 9" in e.reason) for e in job.lost_events()] == [(1, True)]


def test_ranks_a_stop_terminated_are_no_failure():
    job = _ranks((_train,), (_train,))
    job.stop()
    job.terminate()
    assert job.exit_code() == 0 and job.lost_events() == [] and job.outcome() == (False, "stopped")
