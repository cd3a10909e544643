"""The app over a real recording: the fixture's events written by the recorder, played by ddptop's ReplaySource."""

from __future__ import annotations

import pytest

from ddptop.front.pipeline import compose
from ddptop.record.replay import ReplaySource
from ddptop.record.sqlite import RecordingWriter, base_meta
from ddptop.tui.app import DdptopApp
from screen_text import screen_text



@pytest.fixture
def recording(tmp_path, events):
    path = str(tmp_path / "fixture.db")
    writer = RecordingWriter(path, base_meta({"model": "tiny", "sync": {"strategy": "allreduce"}},
                                             {"source": "local", "world_size": 2}), clock="events")
    for i in range(0, len(events), 50):
        writer.handle(events[i:i + 50])
    writer.close()
    return path


@pytest.mark.asyncio
async def test_replay_of_a_recording_plays_seeks_and_jumps(recording):
    source = ReplaySource(recording, playing=False)
    app = DdptopApp(compose(source))
    try:
        async with app.run_test(size=(160, 48)) as pilot:
            await pilot.press("g", *"250", "enter")
            await pilot.pause(0.5)
            snap = app.state.snapshot()
            assert 245 <= snap.step <= 260 and snap.config["strategy"] == "gather-scatter"
            assert "step 2" in screen_text(app).split("\n")[0]
            await pilot.press("right_square_bracket")
            await pilot.pause(0.5)
            assert app.state.snapshot().config["strategy"] == "allreduce"
            assert app.state.snapshot().config["async_op"] is True
            await pilot.press("plus", "space")
            assert source.status()["playing"] and source.status()["speed"] == 2.0
            await pilot.press("6")
            await pilot.pause(0.5)
            text = screen_text(app)
            # the marker's label, right of its line or left of it when it would not fit
            assert "┊3 allreduce async" in text or "3 allreduce async batch=16 lr=0.05┊" in text, text
    finally:
        source.close()


def test_without_a_terminal_the_replay_plays_headless(recording, capsys):
    from ddptop.front.replay import play_on_screen as run_replay

    source = ReplaySource(recording, speed=16.0, playing=False)
    try:
        assert run_replay(source) == 0
    finally:
        source.close()
    out, err = capsys.readouterr()
    assert "replaying headless" in err
    assert "step 400/400 loss" in out and "Test set: Average loss" in out
