"""ReplaySource: the recorded stream on a playback clock, with play/pause/speed/seek and history after a seek."""

from __future__ import annotations

import time

import pytest

from calibrate import Calibrated

from ddptop.events import ConfigApplied
from ddptop.events import RankJoined, RunFinished, RunStarted, Span, StepDone, StepSpans, SystemSample
from ddptop.record.replay import ReplaySource
from ddptop.record.sqlite import RecordingWriter, base_meta

T0 = 1.7e9
STEPS, HZ, SWITCH = 40, 10.0, 20  # 4 s of 2 ranks; segment 1 (allreduce) from step 20
DDP = {"strategy": "ddp", "bucket_mb": 25.0, "async_op": False, "batch_size": 16, "lr": 0.1}
ALLREDUCE = {**DDP, "strategy": "allreduce"}


def stream() -> list:
    out = [RankJoined(r, 2, "h", 1, "cpu", "gloo", 1, "2", "0.1.0", "local", T0) for r in (0, 1)]
    out.append(RunStarted("tiny", "synthetic", 2, "ddp", 25.0, False, 16, 0.1, 10, 40, 2, (("a", 10),), 20, T0))
    out += [ConfigApplied(r, 0, 0, DDP, 0, "start", T0) for r in (0, 1)]
    for step in range(STEPS):
        t = T0 + (step + 1) / HZ
        segment = int(step >= SWITCH)
        if step == SWITCH:
            out += [ConfigApplied(r, step, 1, ALLREDUCE, 1, "ctl@h:1", t - 0.05) for r in (0, 1)]
        for r in (0, 1):
            out.append(StepDone(r, step, 0, segment, t, 0.1, 0.0, 0.06, 0.03, 0.01, 0.5, 16, 2.0 - step / 40, 40, 40,
                                40, step % 5 == 0))
            if step % 5 == 0:
                out.append(StepSpans(r, step, segment, t - 0.1, (Span("fwd", "a", 0.0, 0.05),)))
            if step % 5 == 2:
                out.append(SystemSample(r, "h", t, 50.0, 60.0, 1, 2, 3, "lo"))
    out += [RunFinished(r, STEPS, "done", T0 + STEPS / HZ + 0.01) for r in (0, 1)]
    return out


@pytest.fixture(scope="module")
def path(tmp_path_factory) -> str:
    path = str(tmp_path_factory.mktemp("replay") / "r.db")
    writer = RecordingWriter(path, base_meta({"model": "tiny"}, {"world_size": 2}), clock="events")  # written at once
    writer.handle(stream())
    writer.close()
    return path


def play_all(source: ReplaySource, limit_s: float = 10.0) -> list:
    out, deadline = [], time.monotonic() + limit_s
    while not source.finished and time.monotonic() < deadline:
        out += source.poll()
        time.sleep(0.02)
    return out + source.poll()


def test_playing_returns_the_recorded_stream_in_order(path):
    with Calibrated() as cal:
        source = ReplaySource(path, speed=16)
        start = time.monotonic()
        events = play_all(source)
        took = time.monotonic() - start
    assert events == stream()
    # the recording is 4 s long: at 16x a quarter of a second, never less (the playback clock); at most 1 s times
    # the machine's slowdown measured around it (calibrate.py), where 1x would take 4 s
    assert 4.0 / 16 * 0.8 < took < cal.bound(1.0), (took, cal.factor)
    status = source.status()
    assert status["step"] == STEPS - 1 and status["step_end"] == STEPS - 1 and not status["playing"]
    assert status["t"] == pytest.approx(status["t_end"]) and source.finished
    source.close()


def test_events_arrive_on_the_playback_clock(path):
    source = ReplaySource(path, speed=1)
    first = source.poll()
    assert [e.kind for e in first[:3]] == ["rank_joined", "rank_joined", "run_started"]
    time.sleep(0.55)
    steps = [e.step for e in source.poll() if isinstance(e, StepDone)]
    assert steps and max(steps) <= 6  # 0.55 s at 10 steps/s; never the future
    source.pause()
    assert not source.status()["playing"]
    held = source.status()["t"]
    time.sleep(0.2)
    assert [e for e in source.poll() if isinstance(e, StepDone)] == [] and source.status()["t"] == held
    source.toggle()
    assert source.status()["playing"]
    source.close()


def test_speed_is_clamped_to_half_to_sixteen(path):
    source = ReplaySource(path)
    for asked, got in ((0.1, 0.5), (4, 4.0), (100, 16.0), (float("inf"), 16.0)):
        source.set_speed(asked)
        assert source.status()["speed"] == got
    source.close()


def test_seek_step_gives_a_new_generation_and_the_history_to_redraw(path):
    source = ReplaySource(path, playing=False, history_steps=5)
    source.poll()
    source.seek_step(30)
    assert source.generation == 1 and source.status()["step"] == 30
    history = source.poll()
    kinds = [e.kind for e in history]
    assert kinds[:3] == ["rank_joined", "rank_joined", "run_started"]
    switches = [e for e in history if isinstance(e, ConfigApplied)]
    assert [(e.segment, e.step) for e in switches] == [(0, 0), (0, 0), (1, SWITCH), (1, SWITCH)]
    steps = sorted({e.step for e in history if isinstance(e, StepDone)})
    assert steps == [26, 27, 28, 29, 30]  # the last 5 steps of each rank, nothing after step 30
    assert {e.rank for e in history if isinstance(e, StepDone)} == {0, 1}
    assert [e.step for e in history if isinstance(e, StepSpans)] == [25, 25, 30, 30]  # 2 sampled steps per rank
    assert source.poll() == []  # paused: nothing more until play
    source.play()
    rest = play_all(source)
    assert min(e.step for e in rest if isinstance(e, StepDone)) == 31
    source.close()


def test_seek_time_and_segments(path):
    source = ReplaySource(path, playing=False)
    segments = source.status()["segments"]
    assert [(s["index"], s["step"], s["config"]["strategy"]) for s in segments] == [(0, 0, "ddp"), (1, SWITCH,
                                                                                                   "allreduce")]
    source.jump_segment(1)
    history = source.poll()
    assert history[-1] == ConfigApplied(1, SWITCH, 1, ALLREDUCE, 1, "ctl@h:1", T0 + (SWITCH + 1) / HZ - 0.05)
    assert max(e.step for e in history if isinstance(e, StepDone)) == SWITCH - 1
    source.seek_time(1.0)  # 1 s after the first event: steps 0-9 done
    assert source.generation == 2 and source.status()["t"] == 1.0
    assert max(e.step for e in source.poll() if isinstance(e, StepDone)) == 9
    source.seek_time(1e9)
    assert source.status()["t"] == source.t_end and source.finished is False
    assert any(isinstance(e, RunFinished) for e in source.poll()) and source.finished
    source.play()  # at the end, play starts over
    assert source.status()["t"] < 0.5 and source.generation == 4
    source.close()
