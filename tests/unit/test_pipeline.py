"""The front's one pipeline (front.pipeline): derived events added in one place, a dead local rank lost once, and no
other module building a Feed. Real parts: a real rank process that dies, a heartbeat it sent."""

from __future__ import annotations

import ast
import multiprocessing
import pathlib
import time

from ddptop.control import store as stores
from ddptop.control.bus import Liveness
from ddptop.events import RankLost, RecorderFailed
from ddptop.front.pipeline import compose
from ddptop.front.recording import RecorderAlarm
from ddptop.front.supervisor import LocalJob

ROOT = pathlib.Path(__file__).resolve().parents[2] / "ddptop"


class Nothing:
    """A source that has nothing to say (the ranks sent nothing): what remains is what the front derives."""

    def poll(self):
        return []

    def close(self):
        pass


def _die() -> None:
    raise SystemExit(3)


def test_a_local_rank_that_dies_is_lost_once_though_both_watchers_see_it():
    """Before: LocalJob.lost_events and Liveness each made a RankLost for the same dead rank (two lines, two rows)."""
    liveness = Liveness(1, lost_after_s=1.0)
    liveness.beat(0, 1, 4)  # its one heartbeat, as the hub hands it on
    proc = multiprocessing.get_context("spawn").Process(target=_die)
    proc.start()
    proc.join(30)
    assert proc.exitcode == 3
    job = LocalJob([proc], [0])
    got = []

    class Sink:
        def handle(self, events):
            got.extend(events)

    feed = compose(Nothing(), world_size=1, liveness=liveness, job=job, sinks=[Sink()])
    deadline = time.monotonic() + 8
    while time.monotonic() < deadline and not (liveness.lost and got):
        feed.pump()
        time.sleep(0.2)
    feed.stop()
    assert liveness.lost, "the heartbeat watcher saw the rank go silent too"
    lost = [e for e in got if isinstance(e, RankLost)]
    assert len(lost) == 1 and "exited with code 3" in lost[0].reason, lost


def test_a_recording_failure_reaches_the_stream_through_the_pipeline():
    got = []

    class Sink:
        def handle(self, events):
            got.extend(events)

    alarm = RecorderAlarm("/tmp/x.db", required=False)
    feed = compose(Nothing(), sinks=[Sink()], alarm=alarm)
    alarm("database or disk is full")  # the recorder's thread calls it so
    feed.pump()
    assert [type(e) for e in got] == [RecorderFailed] and got[0].reason == "database or disk is full"


def test_a_replay_gets_no_derived_events():
    """A recording holds the derived events it had live: replaying it must not derive them again."""
    recorded = [RankLost(1, 3, "process 77 exited with code 3", 1.0), RankLost(1, 3, "no heartbeat for 10 s", 2.0)]
    got = []

    class Source(Nothing):
        def poll(self):
            out, recorded[:] = list(recorded), []
            return out

    class Sink:
        def handle(self, events):
            got.extend(events)

    feed = compose(Source(), sinks=[Sink()])
    feed.pump()
    assert feed.derived is None and len(got) == 2  # as recorded, even what a live front would have merged


def test_only_the_pipeline_builds_a_feed():
    """One place composes the front: every other module gets its Feed from front.pipeline.compose."""
    builders = []
    for path in ROOT.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", "")) == "Feed":
                builders.append(str(path.relative_to(ROOT)))
    assert builders == ["front/pipeline.py"], builders


def test_a_dead_ranks_loss_survives_a_heartbeat_read_that_fails_in_the_same_pump(capsys):
    """Issue 41: LocalJob.lost_events hands each dead rank's RankLost out once; when Liveness.check raised in the
    same pump (the store gone, a desync) Derived dropped everything it had gathered, so that rank was never reported
    lost. Real parts: a rank process that exited with code 3, a Liveness whose watched store's server has shut down."""
    import gc

    server = stores.serve(0, "127.0.0.1")
    public = stores.connect("127.0.0.1", server.port, 10)  # the store Liveness watches for a flood of keys
    del server
    gc.collect()  # the server is gone: every read of the store raises now
    proc = multiprocessing.get_context("spawn").Process(target=_die)
    proc.start()
    proc.join(30)
    assert proc.exitcode == 3
    got = []

    class Sink:
        def handle(self, events):
            got.extend(events)

    feed = compose(Nothing(), world_size=1, liveness=Liveness(1, lost_after_s=1.0, public=public),
                   job=LocalJob([proc], [0]), sinks=[Sink()])
    for _ in range(3):
        feed.pump()
        time.sleep(1.1)  # past pipeline.LIVENESS_EVERY_S: the heartbeats are read (and fail) at each pump
    assert feed.errors >= 2 and "derived events" in (feed.error or ""), (feed.errors, feed.error)
    lost = [e for e in got if isinstance(e, RankLost)]
    assert len(lost) == 1 and "exited with code 3" in lost[0].reason, lost
    assert "derived events" in capsys.readouterr().err  # the failure is still said
