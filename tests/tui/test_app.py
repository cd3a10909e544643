"""Pilot tests: every key, button and control of the app, over the fixed replay of a real 2-rank job."""

from __future__ import annotations

import asyncio
import contextlib
import json
import pathlib
import sys
import threading
import time

import pytest
from textual.widgets import Input, Select, Switch, TabbedContent

from ddptop.front.pipeline import compose
from ddptop.tui.app import DdptopApp
from ddptop.tui.keys import GLOBAL_KEYS, REPLAY_KEYS
from ddptop.tui.messages import ApplyRequested, ControlUpdate
from ddptop.tui.widgets.controls import ControlsPanel
from ddptop.tui.widgets.header import StatusHeader
from ddptop.tui.widgets.help import HelpScreen
from ddptop.tui.widgets.network import NetworkPanel
from ddptop.tui.widgets.ranks import RanksPanel
from ddptop.tui.widgets.timeline import TimelinePanel
from fixed_replay import FixedReplaySource
from screen_text import drawn_text, screen_text

pytestmark = pytest.mark.asyncio
BIG = (160, 48)


def _active(app) -> str:
    return app.query_one(TabbedContent).active


async def _until(pilot, check, deadline_s: float = 20.0) -> None:
    """Until `check()` holds or the deadline passes (the assert after it says what was wrong): the app takes what the
    source holds at its next tick (4 Hz), later on a loaded machine. The source's clock stands still meanwhile."""
    end = time.monotonic() + deadline_s
    while not check() and time.monotonic() < end:
        await pilot.pause(0.05)


async def test_number_keys_and_tab_move_between_panels(replay_at_end):
    app = DdptopApp(compose(replay_at_end))
    async with app.run_test(size=BIG) as pilot:
        assert _active(app) == "overview"  # the default
        for key, pid in zip("12345678", ("overview", "ranks", "network", "util", "timeline", "loss", "controls",
                                         "whatif")):
            await pilot.press(key)
            assert _active(app) == pid
        await pilot.press("7", "tab")  # the controls are disabled in a replay: tab goes straight on
        assert _active(app) == "whatif"
        await pilot.press("tab")
        assert _active(app) == "overview"
        await pilot.press("shift+tab", "shift+tab", "shift+tab")
        assert _active(app) == "loss"
        await pilot.click("#--content-tab-network")
        assert _active(app) == "network"


async def test_help_lists_every_key_and_closes(replay_at_end):
    app = DdptopApp(compose(replay_at_end))
    async with app.run_test(size=BIG) as pilot:
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        text = await drawn_text(pilot, app)
        for key, _ in GLOBAL_KEYS + REPLAY_KEYS:
            assert key in text
        await pilot.press("q")  # closes the help, does not quit
        assert not isinstance(app.screen, HelpScreen) and app.is_running
        await pilot.press("question_mark", "escape")
        assert not isinstance(app.screen, HelpScreen)


async def test_q_quits(replay_at_end):
    app = DdptopApp(compose(replay_at_end))
    async with app.run_test(size=BIG) as pilot:
        await pilot.press("q")
        await pilot.pause()
        assert not app.is_running


async def test_transport_keys_play_speed_seek_and_segments(events):
    now = [0.0]
    source = FixedReplaySource(events, clock=lambda: now[0])
    app = DdptopApp(compose(source))
    async with app.run_test(size=BIG) as pilot:
        await pilot.press("space")
        assert source.playing
        now[0] += 6.0  # the fixture's first step ends ~4.5 s in
        await _until(pilot, lambda: app.state.snapshot().step > 0)
        assert 0 < app.state.snapshot().step < 400
        await pilot.press("plus", "plus")
        assert source.speed == 4.0
        await pilot.press("minus")
        assert source.speed == 2.0
        await pilot.press("space")
        assert not source.playing
        await pilot.press("g")
        assert app.focused.id == "seek"
        await pilot.press(*"200", "enter")
        await _until(pilot, lambda: app.state.snapshot().step in (200, 201))
        assert source.status()["step"] == 200 and app.state.snapshot().step in (200, 201)
        generation = source.generation
        await pilot.press("full_stop")
        assert source.status()["step"] == 210 and source.generation == generation + 1
        await pilot.press("comma", "comma")
        assert source.status()["step"] == 190
        await pilot.press("right_square_bracket")  # step 190 is in segment 1 (ddp from 111): next is 2, from 212
        assert source.status()["step"] == 211
        await pilot.press("left_square_bracket")
        assert source.status()["step"] == 110
        await _until(pilot, lambda: "segment 1 of 0–3" in screen_text(app) and "· segment 1 ·" in screen_text(app))
        text = screen_text(app)
        assert "segment 1 of 0–3" in text and "· segment 1 ·" in text  # the bar and the header agree


async def test_transport_buttons_work_with_the_mouse(events):
    source = FixedReplaySource(events, clock=lambda: 0.0)
    app = DdptopApp(compose(source))
    async with app.run_test(size=BIG) as pilot:

        async def click(selector):
            await pilot.click(selector)
            await pilot.pause(0.6)  # two quick clicks would make one double click

        await click("#toggle")
        assert source.playing
        await click("#faster")
        assert source.speed == 2.0
        await click("#slower")
        await click("#slower")
        assert source.speed == 0.5
        await click("#seg-next")
        assert source.status()["step"] == 110  # segment 1 starts before step 111
        await click("#seg-prev")
        assert source.status()["step"] is None  # segment 0 starts before the first step


async def test_ranks_panel_picks_a_rank_and_opens_its_timeline(replay_at_end):
    app = DdptopApp(compose(replay_at_end))
    async with app.run_test(size=BIG) as pilot:
        await pilot.press("2")
        panel = app.query_one(RanksPanel)
        assert app.focused is panel
        await pilot.press("down")
        assert panel.selected == 1
        await pilot.press("up")
        assert panel.selected == 0
        await pilot.click(RanksPanel, offset=(5, 2))  # the second table row: rank 1
        assert panel.selected == 1
        await pilot.press("enter")
        assert _active(app) == "timeline" and app.query_one(TimelinePanel).rank == 1


async def test_network_panel_switches_interface_and_node(replay_at_end):
    app = DdptopApp(compose(replay_at_end))
    async with app.run_test(size=BIG) as pilot:
        await pilot.press("3")
        panel = app.query_one(NetworkPanel)
        assert "Active Interface: lo" in screen_text(app)
        await pilot.press("left")
        assert panel.iface == "ifb1"
        await pilot.pause()
        assert "Active Interface: ifb1" in screen_text(app)
        await pilot.press("right", "right")
        assert panel.iface == "eth0"
        await pilot.press("down")  # one node: stays, and goes back to the job's interface
        assert panel.node == 0 and panel.iface is None
        title = screen_text(app).split("\n")[5]
        await pilot.click(NetworkPanel, offset=(title.index(" eth0") + 1, 0))
        assert panel.iface == "eth0"


async def test_timeline_moves_through_steps_and_ranks(replay_at_end):
    app = DdptopApp(compose(replay_at_end))
    async with app.run_test(size=BIG) as pilot:
        await pilot.press("5")
        panel = app.query_one(TimelinePanel)
        assert panel.shown_step() == 399 and "rank 0 · sampled step 399" in screen_text(app)
        await pilot.press("left", "left")
        assert panel.shown_step() == 379
        await pilot.press("less_than_sign")
        assert panel.shown_step() == 91
        await pilot.press("right")
        assert panel.shown_step() == 101
        await pilot.press("greater_than_sign", "down")
        assert panel.step is None and panel.rank == 1
        await pilot.pause()
        text = screen_text(app)
        assert "rank 1 · sampled step 399" in text and "overlap" in text and "features.0" in text and "compute" in text


async def test_loss_panel_marks_every_config_change(replay_at_end):
    app = DdptopApp(compose(replay_at_end))
    async with app.run_test(size=BIG) as pilot:
        await pilot.press("6")
        await pilot.pause()
        text = screen_text(app)
        for label in ("┊1 ddp bucket=0.02MB", "┊2 gather-scatter", "┊3 allreduce async"):
            assert label in text, text
        assert "loss" in text and "step time" in text and "test accuracy" in text


async def test_controls_are_disabled_in_a_replay(replay_at_end):
    app = DdptopApp(compose(replay_at_end))
    async with app.run_test(size=BIG) as pilot:
        await pilot.press("7")
        panel = app.query_one(ControlsPanel)
        assert all(w.disabled for w in panel.query("Select, Input, Switch, Button"))
        assert "disabled" in screen_text(app)
        assert panel.query_one("#strategy", Select).value == "allreduce"  # the config in force at the end


class _NoJob:
    """A `connect` that records its calls and fails like an unreachable job (nothing else is faked). These Pilot tests
    are about what must NOT reach a job (a refused form, space after the job ended): counting calls proves it without
    one. The path to a real job (the form's bucket, batch and strategy, and space) is tests/tui/test_e2e_tmux.py's,
    checked in the recording."""

    def __init__(self):
        self.calls = 0

    def __call__(self):
        self.calls += 1
        raise ConnectionError("connection refused")


async def test_controls_check_input_inline_and_send_only_valid_changes(replay_at_end):
    connect, posted = _NoJob(), []
    app = DdptopApp(compose(replay_at_end), mode="live", connect=connect)
    async with app.run_test(size=BIG, message_hook=posted.append) as pilot:
        await pilot.press("7")
        panel = app.query_one(ControlsPanel)
        assert app.focused.id == "strategy"  # in force: allreduce async, batch 16, lr 0.05

        async def apply(expect: str):
            await pilot.pause(0.6)  # two quick clicks would make one double click
            await pilot.click("#apply")
            assert expect in panel.status and panel.status_kind == "error", panel.status
            assert connect.calls == 0

        batch = panel.query_one("#batch", Input)
        batch.value = "x"
        await apply("batch size must be a whole number")
        batch.value = "16"
        await apply("nothing to change")
        panel.query_one("#bucket", Input).value = "10"
        await apply("bucket_mb applies only to ddp")  # SyncConfig.changed's refusal, shown here, never sent
        panel.query_one("#strategy", Select).value = "ddp"
        panel.query_one("#bucket", Input).value = "-3"
        await apply("bucket size")
        panel.query_one("#bucket", Input).value = "10"
        panel.query_one("#strategy", Select).focus()
        # strategy → bucket → async → batch → lr → scale_lr → accum → compress → lr warm-up → Apply
        await pilot.press(*["tab"] * 9)
        assert app.focused.id == "apply"
        await pilot.press(*["shift+tab"] * 7)
        assert app.focused.id == "async"
        await pilot.press("space")  # async_op on with ddp: refused inline
        await pilot.pause()
        assert "async_op applies only to allreduce" in str(panel.query_one("#preview").render())
        await pilot.press("space", *["tab"] * 7, "enter")
        await app.workers.wait_for_complete()
        await pilot.pause()
        sent = list({id(m): m.changes for m in posted if isinstance(m, ApplyRequested)}.values())  # one per hop
        assert sent == [{"strategy": "ddp", "bucket_mb": 10.0, "async_op": False}] and connect.calls == 1
        assert "cannot reach the job" in panel.status and panel.status_kind == "error"
        assert "about 1 bucket" in str(panel.query_one("#buckets").render())  # tiny: 84 KB in one 10 MB bucket


async def test_typed_characters_go_to_the_focused_field(replay_at_end):
    app = DdptopApp(compose(replay_at_end), mode="live", connect=_NoJob())
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("7", "tab", "tab", "tab", "tab")  # strategy → bucket → async → batch → lr
        lr = app.query_one("#lr", Input)
        assert app.focused is lr
        await pilot.press("ctrl+a", "ctrl+k", *"0.01")  # digits and '.' are not panel or replay keys here
        assert lr.value == "0.01" and _active(app) == "controls"
        await pilot.pause()
        assert "lr=0.01" in str(app.query_one("#preview").render())
        await pilot.press("escape", "1")  # out of the field, the edit discarded; digits switch panels again
        assert _active(app) == "overview" and lr.value == "0.05"  # the fixture's lr in force


def _footer(app) -> str:
    return screen_text(app).split("\n")[-1]


async def test_a_number_field_takes_digits_esc_discards_and_the_footer_says_so(replay_at_end):
    """Issue 26: `1` and space typed in the batch field made `641`, esc left it ready to send. Rule: digits are a
    number field's (the footer drops `1-8 Panels` and shows esc while one has focus); space is never typed into it;
    esc puts back what is in force (batch 16 in the fixture) and nothing is sent."""
    connect, posted = _NoJob(), []
    app = DdptopApp(compose(replay_at_end), mode="live", connect=connect)
    async with app.run_test(size=BIG, message_hook=posted.append) as pilot:
        await pilot.press("7")
        await pilot.pause()
        assert "1-8 Panels" in _footer(app)  # on the strategy list digits still switch panels
        await pilot.press("tab", "tab", "tab")
        batch = app.query_one("#batch", Input)
        assert app.focused is batch and batch.value == "16"
        await pilot.pause()
        footer = _footer(app)
        assert "1-8" not in footer and "esc Discard edits" in footer, footer
        await pilot.press("1", "space")  # tab selected the field's text: the digit types over it
        assert batch.value == "1" and _active(app) == "controls"  # the digit is an edit; space is not typed
        await pilot.press("escape")
        await pilot.pause()
        assert batch.value == "16" and app.focused is None
        assert "nothing to change" in str(app.query_one("#preview").render())
        await pilot.press("7")  # the panel shown: back into its form
        assert app.focused.id == "strategy"
        await pilot.press("1")
        assert _active(app) == "overview"
        await pilot.press("7", "tab", "tab", "tab", "1", *["tab"] * 8)  # 1 again; lr … warm-up, Apply, Tune, out
        assert _active(app) == "whatif" and batch.value == "16"  # left the form (to the next panel): nobody edits it
        await pilot.press("7")
        await pilot.click("#apply")
        await pilot.pause()
        assert not [m for m in posted if isinstance(m, ApplyRequested)] and connect.calls == 0


class _TinyJob:
    """tests/cli/test_tune.py's headless 2-rank tiny DDP job (batch 16), its output read as it comes, and live apps
    whose controls reach it through the client the live screen opens (role "tui"). The tuner measures each trial
    over 8 steps (testhooks.tune_steps: what the button's test checks does not depend on the trial's length;
    cli/test_tune.py tunes over the full 20)."""

    def __init__(self, folder: pathlib.Path):
        from test_tune import TOKEN, _job

        import ports

        self.token, self.port, self.db = TOKEN, ports.port(), folder / "run.db"
        self.proc = _job(folder, self.port, "--strategy", "ddp", "--batch-size", "16",
                         env={"DDPTOP_TEST_FRONT": "tune-steps:8"})
        self.out: list[str] = []
        self.err: list[str] = []
        self.readers = [threading.Thread(target=lambda f=f, into=into: into.extend(f), daemon=True)
                        for f, into in ((self.proc.stdout, self.out), (self.proc.stderr, self.err))]
        for reader in self.readers:
            reader.start()

    def wait(self, what: str, check, deadline_s: float = 60.0):
        """`check()`'s first true value, polled while the job runs; what it wrote in the failure."""
        end = time.monotonic() + deadline_s
        while time.monotonic() < end:
            got = check()
            if got:
                return got
            assert self.proc.poll() is None, f"the job ended before {what}: {''.join(self.err)[-3000:]}"
            time.sleep(0.2)
        raise AssertionError(f"no {what} within {deadline_s:.0f} s")

    def client(self):
        """A control client once rank 0 answers."""
        from ddptop.control.client import ControlClient

        def answering():
            with contextlib.suppress(Exception):  # not listening yet, or rank 0 not there yet
                client = ControlClient("127.0.0.1", self.port, self.token)
                client.status()
                return client

        return self.wait("rank 0's answer", answering)

    @contextlib.asynccontextmanager
    async def used(self):
        """Rank 0's status once it answers, waited for beside the test's app (started first: the job does not
        train while the app starts); the job is paused when the test is done (`pause`: its ranks idle until a later
        test resumes it, just before it asks the job for something; the recording is complete up to the pause)."""
        try:
            yield await asyncio.to_thread(lambda: self.client().status())
        finally:
            if self.proc.poll() is None:
                await asyncio.to_thread(self.pause)

    async def resumed(self) -> None:
        if (await asyncio.to_thread(lambda: self.client().status()))["paused"]:
            await asyncio.to_thread(self.client().send, "resume")

    def app(self, replay) -> DdptopApp:
        from ddptop.control.client import ControlClient

        return DdptopApp(compose(replay), mode="live",
                         connect=lambda: ControlClient("127.0.0.1", self.port, self.token, role="tui"))

    def printed(self, text: str) -> str:
        """The job's stdout once `text` is in it (the job prints a line, then the reader gets it)."""
        return self.wait(f"{text!r} on the job's stdout", lambda: text in "".join(self.out) and "".join(self.out))

    def pause(self) -> None:
        """Pause the job, and wait until the recording holds each rank's pause: everything a rank sent before it (its
        steps, the configs it applied, its memory samples) is in the recording then, as once the job is stopped (a
        rank's events reach the recording in its order), and nothing comes after it until a test resumes the job."""
        from procs import recording_rows

        client = self.client()
        client.send("pause")
        status = self.wait("rank 0 paused", lambda: (s := client.status())["paused"] and s)
        self.wait(f"both ranks' pause at step {status['step']} in the recording", lambda: recording_rows(
            self.db, "SELECT count(DISTINCT rank) FROM events WHERE kind = 'run_state' AND step = ? AND "
            "json_extract(data, '$.paused')", (status["step"],)) == [(2,)])

    def stop(self) -> None:
        self.client().send("stop")
        self.proc.wait(timeout=120)
        for reader in self.readers:
            reader.join(timeout=30)
        assert self.proc.returncode == 0, "".join(self.err)[-3000:]


@pytest.fixture(scope="module")
def tiny_job(tmp_path_factory):
    """One job for the two tests of the controls that reach a real job, in the file's order: the tune button's
    (tune bucket wants ddp, the job's start), then the shard unit field's (it leaves the job on zero3). Stopped at
    the module's end (exit 0), killed if something is left."""
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "cli"))
    job = _TinyJob(tmp_path_factory.mktemp("tiny-job"))
    try:
        yield job
        job.stop()
    finally:
        if job.proc.poll() is None:
            job.proc.kill()
            job.proc.wait()


async def test_the_tune_button_asks_the_job_and_says_its_answer_in_the_panel(replay_at_end, tiny_job):
    """Tune buckets on a real 2-rank DDP job (tests/cli/test_tune.py's headless tiny job, the module's): the button's
    request reaches the job through the client the live screen opens (front/screen.py's ControlClient, role "tui"),
    and the panel's status line is the job's answer, checked against what the app did not compute: the line the job
    itself printed when its tune ended, and the tune's note in its recording (SQL, test_tune's check; its request
    id 1: the job's first request, the button's)."""
    posted = []
    app = tiny_job.app(replay_at_end)
    async with app.run_test(size=BIG, message_hook=posted.append) as pilot, tiny_job.used() as before:
        assert (before["segment"], before["config"]["strategy"], before["paused"]) == (0, "ddp", False), \
            f"the job is not the fresh ddp job this test runs first on: {before}"
        await pilot.press("7")
        await pilot.click("#tune")
        await app.workers.wait_for_complete()
        await pilot.pause()
        panel = app.query_one(ControlsPanel)
        status, kind = panel.status, panel.status_kind
    assert any(type(m).__name__ == "TuneRequested" for m in posted)
    assert status.startswith("tune bucket: kept ") and kind == "ok", status
    tiny_job.printed(status)  # the job's own printed line, word for word
    from test_tune import check_tune_recording  # on sys.path once the module's job started

    note = check_tune_recording(tiny_job.db)
    assert note["request_id"] == 1, note


async def test_the_shard_unit_field_is_zero2_and_zero3s_and_a_unit_that_names_no_module_is_refused(replay_at_end,
                                                                                                tiny_job):
    """The shard unit field on a real 2-rank tiny DDP job (test_tune's headless job, the module's, after the tune
    button's test): off while the form's strategy is not zero2/zero3 and never sent then; on for zero3, a misspelt
    unit refused here in one line (nothing sent), a unit that names no module of the model refused by rank 0 in one
    line (the job unchanged), then `Conv2d` applied. The recording says what reached the job (SQL): from the segment
    in force before, one zero3 segment, shard_unit Conv2d."""
    import sqlite3

    posted, said = [], []
    app = tiny_job.app(replay_at_end)
    async with app.run_test(size=BIG, message_hook=posted.append) as pilot, tiny_job.used() as before:
        assert before["config"]["strategy"] == "ddp", before
        await pilot.press("7")
        panel = app.query_one(ControlsPanel)
        unit, strategy = panel.query_one("#unit", Input), panel.query_one("#strategy", Select)
        assert unit.disabled and strategy.value == "allreduce"  # the fixture's strategy in force

        async def apply(text: str) -> None:
            unit.value = text
            await pilot.pause(0.6)  # two quick clicks would make one double click
            await pilot.click("#apply")
            await app.workers.wait_for_complete()
            await pilot.pause()
            said.append((panel.status, panel.status_kind))

        strategy.value = "zero3"
        await pilot.pause()
        assert not unit.disabled
        await apply("Conv2d;")  # not a module name's spelling: the form's own check
        await tiny_job.resumed()  # what follows reaches the job: it trains again
        await apply("NoSuchBlock")  # a name rank 0 finds no module for
        await apply("Conv2d")
        strategy.value = "ddp"
        await pilot.pause()
        assert unit.disabled and "shard_unit" not in str(panel.query_one("#preview").render())
    (misspelt, kind1), (nomodule, kind2), (applied, kind3) = said
    assert kind1 == "error" and misspelt.startswith("shard_unit must be up to 64 module class names"), misspelt
    assert kind2 == "error" and "\n" not in nomodule, nomodule
    assert nomodule.startswith("refused by rank 0: shard unit 'NoSuchBlock' names no module of this model "
                               "(top-level blocks: features, classifier;"), nomodule
    assert kind3 == "ok" and applied.startswith("applied at step "), applied
    sent = list({id(m): m.changes for m in posted if isinstance(m, ApplyRequested)}.values())
    assert [c.get("shard_unit") for c in sent] == ["NoSuchBlock", "Conv2d"], sent  # the misspelt one never left
    with sqlite3.connect(tiny_job.db) as con:
        configs = [json.loads(c) for (c,) in con.execute("SELECT config FROM segments WHERE segment >= ? ORDER BY "
                                                         "segment", (before["segment"],))]
    assert [(c["strategy"], c["shard_unit"]) for c in configs] == [("ddp", ""), ("zero3", "Conv2d")], configs


async def test_the_strategy_field_moves_on_with_arrows_and_opens_its_list_on_enter(replay_at_end):
    app = DdptopApp(compose(replay_at_end), mode="live", connect=_NoJob())
    async with app.run_test(size=BIG) as pilot:
        await pilot.press("7")
        strategy = app.query_one("#strategy", Select)
        assert app.focused is strategy
        await pilot.press("space")  # the app's key (pause; no job here), not the list
        assert not strategy.expanded and app.focused is strategy
        await pilot.press("down")
        assert not strategy.expanded and app.focused.id == "bucket"
        await pilot.press("up")
        assert app.focused is strategy
        await pilot.press("enter")
        assert strategy.expanded
        await pilot.press("escape")
        assert not strategy.expanded and strategy.value == "allreduce"


async def test_the_form_follows_a_change_made_elsewhere_but_keeps_an_edit(events):
    """`ctl` moves the job on (here: the rest of the fixture arrives: segment 3, allreduce async, asked by a
    client that is not this screen): unedited fields and the status line follow; the field being edited keeps
    the user's text."""
    source = FixedReplaySource(events, clock=lambda: 0.0)
    source.seek_step(250)  # segment 2: gather-scatter from step 212
    app = DdptopApp(compose(source), mode="live", connect=_NoJob())
    async with app.run_test(size=BIG) as pilot:
        await pilot.press("7")
        await pilot.pause()
        strategy, lr = app.query_one("#strategy", Select), app.query_one("#lr", Input)
        assert strategy.value == "gather-scatter"
        panel = app.query_one(ControlsPanel)
        app.post_message(ControlUpdate("set", "applied", "applied at step 212 (segment 2) on every rank"))
        await pilot.press("tab", "tab", "tab", "tab", "ctrl+a", "ctrl+k", *"0.2")  # lr: an edit in progress
        source.cursor = source.t_end  # the rest of the run arrives: segment 3 from step 308
        await pilot.pause(0.6)
        assert app.state.snapshot().segment == 3
        assert strategy.value == "allreduce" and app.query_one("#async", Switch).value is True
        assert lr.value == "0.2" and app.focused is lr
        assert "segment 3" in panel.status and "segment 2" not in panel.status, panel.status
        assert "Apply sends {'lr': 0.2}" in str(app.query_one("#preview").render())


async def test_space_in_a_live_session_sends_pause(replay_at_end):
    connect = _NoJob()
    app = DdptopApp(compose(replay_at_end, job=_EndedJob()), mode="live", connect=connect, job=_EndedJob())
    async with app.run_test(size=BIG) as pilot:
        await pilot.press("space")
        assert connect.calls == 0  # the job has ended: nothing to pause
        app.job = _RunningJob()
        await pilot.press("space")
        await app.workers.wait_for_complete()
        await pilot.pause()
        assert connect.calls == 1 and "pause: connection refused" in app.query_one(StatusHeader).action


class _EndedJob:
    def alive(self):
        return False

    def check(self):
        pass

    def lost_events(self):
        return []


class _RunningJob(_EndedJob):
    def alive(self):
        return True


async def test_every_panel_fits_80x24(replay_at_end):
    app = DdptopApp(compose(replay_at_end))
    async with app.run_test(size=(80, 24)) as pilot:
        for key, words in zip("1234567", ("segments", "s/step", "Active Interface", "CPU [", "overlap", "loss",
                                          "strategy")):
            await pilot.press(key)
            await pilot.pause()
            text = screen_text(app)
            assert words in text, text
            assert "Quit" in text.split("\n")[-1]
