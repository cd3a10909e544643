"""Provides DdptopApp, the one screen for live jobs and replays; it draws what the front's feed holds."""

from __future__ import annotations

import time
from typing import Any, Callable

from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.css.query import NoMatches
from textual.widgets import Footer, TabbedContent, TabPane

from ddptop.record.paths import report_dir, shown
from ddptop.tui import control, prefs
from ddptop.tui.messages import (ApplyRequested, ControlUpdate, RankChosen, SectionsChosen, TransportCommand,
                                 TuneRequested)
from ddptop.tui.render import palette
from ddptop.tui.widgets.controls import ControlsPanel
from ddptop.tui.widgets.header import StatusHeader
from ddptop.tui.widgets.help import HelpScreen
from ddptop.tui.widgets.loss import LossPanel
from ddptop.tui.widgets.network import NetworkPanel
from ddptop.tui.widgets.overview import OverviewPanel
from ddptop.tui.widgets.ranks import RanksPanel
from ddptop.tui.widgets.sections import SectionsScreen
from ddptop.tui.widgets.timeline import TimelinePanel
from ddptop.tui.widgets.transport import TransportBar, current_segment, next_speed
from ddptop.tui.widgets.util import UtilPanel
from ddptop.tui.widgets.whatif import WhatIfPanel

PANELS = (("overview", "1 Overview", OverviewPanel), ("ranks", "2 Ranks", RanksPanel),
          ("network", "3 Network", NetworkPanel), ("util", "4 Utilization", UtilPanel),
          ("timeline", "5 Timeline", TimelinePanel), ("loss", "6 Loss", LossPanel),
          ("controls", "7 Controls", ControlsPanel), ("whatif", "8 What-if", WhatIfPanel))
REFRESH_HZ = 4  # the issue asks for 4–10 Hz; with PANEL_EVERY_S the app stays under 15% of a core with 8 ranks
# Plots redraw less often than the header and ranks table: a braille plot of 8 ranks × 2000 steps costs ~50 ms,
# and the timeline only changes every --span-every steps (benchmarks/tui_cpu.py, README).
PANEL_EVERY_S = {"overview": 0.5, "ranks": 0.5, "loss": 1.0, "timeline": 0.5, "network": 0.5, "util": 0.5,
                 "whatif": 0.5}
STOP_WAIT_S = 20.0  # after `q`, ranks get this long to leave at a step boundary before the front terminates them
TEXTUAL_THEMES = {"dark": "textual-dark", "light": "textual-light"}  # Textual's own, for the widgets and borders


class DdptopApp(App):
    """Polls a Source on a timer, reduces its events into a SessionState and pushes snapshots down to the panels.

    Live: `job` is the front's LocalJob, `sinks` get every event (a recording), and `connect` opens a
    ControlClient (called only in thread workers: its calls block on the store). Replay: the source has a
    transport (play, speed, seek) and the controls are disabled.
    """

    TITLE = "ddptop"
    ENABLE_COMMAND_PALETTE = False
    CSS = """
    TabbedContent { height: 1fr; }
    TabbedContent > ContentSwitcher { height: 1fr; }
    TabPane { height: 1fr; padding: 0; overflow-y: auto; }
    """
    BINDINGS = [
        Binding("q", "quit_app", "Quit"),
        Binding("ctrl+c", "quit_app", "Quit", show=False, priority=True),
        Binding("question_mark", "help", "Help", key_display="?"),
        Binding("space", "toggle_pause", "Pause/resume"),
        *(Binding(str(i + 1), f"panel('{pid}')", "Panels", key_display=f"1-{len(PANELS)}", show=i == 0)
          for i, (pid, _, _) in enumerate(PANELS)),
        Binding("pageup", "scroll('page_up')", "Scroll up", show=False),
        Binding("pagedown", "scroll('page_down')", "Scroll down", show=False),
        Binding("home", "scroll('home')", "Top", show=False),
        Binding("end", "scroll('end')", "Bottom", show=False),
        Binding("tab", "cycle(1)", "Next panel", show=False, priority=True),
        Binding("shift+tab", "cycle(-1)", "Previous panel", show=False, priority=True),
        Binding("plus,equals_sign", "transport('faster')", "Faster", show=False),
        Binding("minus", "transport('slower')", "Slower", show=False),
        Binding("comma", "transport('back')", "Back 10 steps", show=False),
        Binding("full_stop", "transport('forward')", "Forward 10 steps", show=False),
        Binding("left_square_bracket", "transport('segment_prev')", "Previous segment", show=False),
        Binding("right_square_bracket", "transport('segment_next')", "Next segment", show=False),
        Binding("g", "seek_input", "Seek to a step", show=False),
        Binding("t", "toggle_theme", "Theme", show=False),
        Binding("o", "sections", "Sections", show=False),
        Binding("ctrl+x", "hide_panel", "Hide panel", show=False),
        Binding("ctrl+o", "show_panels", "Show all panels", show=False),
    ]

    def __init__(self, feed: Any, mode: str = "replay", job: Any = None, connect: Callable | None = None,
                 recording: str | None = None, total_steps: int = 0, refresh_hz: float = REFRESH_HZ):
        super().__init__()
        # the front's feed (front.pipeline.compose): live it runs on its own thread; a replay's is pumped by our timer
        self.feed = feed
        self.source, self.mode, self.job, self.connect = self.feed.source, mode, job, connect
        self.recording = shown(recording) if recording and ":" not in recording else recording  # host:path (attach)
        self.total_steps, self.refresh_hz = total_steps, refresh_hz
        self.state = self.feed.state  # `.snapshot()`: what every panel draws
        self._drawn: dict[str, float] = {}  # panel id → when it last got a snapshot
        self._stop_deadline: float | None = None
        self.prefs, self._prefs_problem = prefs.load()  # the theme and the overview's hidden sections

    @property
    def live(self) -> bool:
        return self.mode == "live"

    def compose(self) -> ComposeResult:
        yield StatusHeader(self.mode, self.recording, self.total_steps, id="header")
        with TabbedContent(id="panels"):
            for pid, title, cls in PANELS:
                with TabPane(title, id=pid):
                    yield cls(enabled=self.live, id=f"{pid}-panel") if cls is ControlsPanel else cls(id=f"{pid}-panel")
        if not self.live:
            yield TransportBar(id="transport")
        yield Footer()

    def on_mount(self) -> None:
        self._use_theme(self.prefs.theme)
        self.query_one(OverviewPanel).hidden = self.prefs.hidden
        if self._prefs_problem:
            self.query_one(StatusHeader).action = self._prefs_problem
        self.set_interval(1 / self.refresh_hz, self.tick)
        self.tick()

    def _use_theme(self, theme: str) -> None:
        palette.use(theme)  # the panels' own colours (Rich text), read at their next frame
        self.theme = TEXTUAL_THEMES[theme]

    # -- the feed ----------------------------------------------------------------------------------------------
    def tick(self) -> None:
        """Pump the feed (a replay's; a live feed runs on its own), then push the snapshot to what is visible."""
        if not self.feed.threaded:
            self.feed.pump()
        if self.job is not None and self._stop_deadline is not None and (
                not self.job.alive() or time.monotonic() > self._stop_deadline):
            self.exit()
        try:
            if not self.live:
                status = self.feed.control(self.source.status)
                self.query_one(TransportBar).status = status
                self.query_one(StatusHeader).replay = status
            self.push()
        except NoMatches:  # the last tick can land while quitting tears the screen down: nothing left to draw
            pass

    def push(self, force: bool = False) -> None:
        """Header and the visible panel get the newest snapshot together (so their figures never disagree); plots
        at most every PANEL_EVERY_S seconds, at once when the run's state changes (paused, finished)."""
        snap = self.state.snapshot()
        header = self.query_one(StatusHeader)
        active = self.query_one(TabbedContent).active or PANELS[0][0]
        panel = self.query_one(f"#{active}-panel")
        shown = header.snapshot
        force = force or shown is None or (shown.run_state, shown.segment) != (snap.run_state, snap.segment)
        now = time.monotonic()
        if not force and now - self._drawn.get(active, 0.0) < PANEL_EVERY_S.get(active, 0):
            return
        self._drawn[active] = now
        header.snapshot = snap
        if isinstance(panel, ControlsPanel):
            panel.show_config(snap)
            return
        if isinstance(panel, OverviewPanel):
            panel.banner = self.ending(snap)
        panel.snapshot = snap

    def ending(self, snap) -> str:
        """How a session ended, where it was recorded and what to do next (live only: a replay has its bar)."""
        if not self.live or not snap.finished:
            return ""
        reasons = sorted({r.state for r in snap.ranks})
        text = f"The run has ended: {snap.step} steps on {len(snap.ranks)} ranks ({', '.join(reasons)})."
        if self.recording and not getattr(self.job, "attached", False):
            text += (f" Recorded to {self.recording}; after q: ddptop report {self.recording} -o "
                     f"{report_dir(self.recording)}.")
        return text + " q leaves."

    def action_scroll(self, how: str) -> None:
        """PgUp/PgDn/Home/End scroll the panel shown (the mouse wheel does too)."""
        pane = self.query_one(TabbedContent).active_pane
        if pane is None:
            return
        {"page_up": pane.scroll_page_up, "page_down": pane.scroll_page_down, "home": pane.scroll_home,
         "end": pane.scroll_end}[how](animate=False)

    def on_tabbed_content_tab_activated(self, event: TabbedContent.TabActivated) -> None:
        if event.pane.id != "controls":  # nobody is editing a form they have left: it shows what is in force again
            self.query_one(ControlsPanel).discard()
        self.push(force=True)
        self.focus_panel()

    def focus_panel(self) -> None:
        """Focus the active panel (or its first field), so arrows act on what is shown."""
        panel = self.query_one(f"#{self.query_one(TabbedContent).active}-panel")
        if panel.can_focus:
            panel.focus()
        else:
            fields = [w for w in panel.query("Select, Input, Switch, Button") if w.focusable]
            self.set_focus(fields[0] if fields else None)

    # -- keys --------------------------------------------------------------------------------------------------
    def shown_panels(self) -> list[str]:
        """The panels whose tabs are not hidden (ctrl+x), in order."""
        tabs = self.query_one(TabbedContent)
        return [pid for pid, _, _ in PANELS if tabs.get_tab(pid).display]

    def action_hide_panel(self) -> None:
        """Hide the panel shown (its tab too) and show the next; its number key or ctrl+o brings it back."""
        tabs, shown = self.query_one(TabbedContent), self.shown_panels()
        if len(shown) > 1 and tabs.active in shown:
            hidden = tabs.active
            tabs.active = shown[(shown.index(hidden) + 1) % len(shown)]
            tabs.hide_tab(hidden)

    def action_show_panels(self) -> None:
        tabs = self.query_one(TabbedContent)
        for pid, _, _ in PANELS:
            tabs.show_tab(pid)

    def action_panel(self, pid: str) -> None:
        tabs = self.query_one(TabbedContent)
        tabs.show_tab(pid)  # a hidden panel's number shows it again
        if tabs.active == pid:  # no TabActivated: focus it here (7 after esc goes back into the form)
            self.focus_panel()
        tabs.active = pid

    def action_cycle(self, delta: int) -> None:
        """Next/previous panel; inside the controls form, tab walks its fields first."""
        tabs = self.query_one(TabbedContent)
        controls = self.query_one(ControlsPanel)
        if tabs.active == "controls" and self.live and self.focused is not None and controls in self.focused.ancestors:
            fields = [w for w in controls.query("Select, Input, Switch, Button") if w.focusable]
            i = fields.index(self.focused) if self.focused in fields else -1
            if 0 <= i + delta < len(fields):
                fields[i + delta].focus()
                return
        ids = self.shown_panels()
        tabs.active = ids[(ids.index(tabs.active) + delta) % len(ids)] if tabs.active in ids else ids[0]

    def action_toggle_theme(self) -> None:
        """t: dark ↔ light, kept for the next screen (tui.prefs)."""
        self.prefs = prefs.Prefs(theme="light" if self.prefs.theme == "dark" else "dark", hidden=self.prefs.hidden)
        self._use_theme(self.prefs.theme)
        self.query_one(StatusHeader).action = prefs.save(self.prefs) or f"theme: {self.prefs.theme} (t switches)"
        for pid, _, _ in PANELS:  # a snapshot unchanged since the last frame would not redraw them
            self.query_one(f"#{pid}-panel").refresh(layout=True)
        self._drawn.clear()
        self.push(force=True)

    def action_sections(self) -> None:
        """o: choose the overview's sections."""
        if not isinstance(self.screen, SectionsScreen):
            self.push_screen(SectionsScreen(self.prefs.hidden))

    def on_sections_chosen(self, message: SectionsChosen) -> None:
        self.prefs = prefs.Prefs(theme=self.prefs.theme, hidden=message.hidden)
        self.query_one(OverviewPanel).hidden = message.hidden
        problem = prefs.save(self.prefs)
        if problem:
            self.query_one(StatusHeader).action = problem

    def action_help(self) -> None:
        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen(replay=not self.live))

    def action_quit_app(self) -> None:
        """Live: ask every rank to stop at the next step boundary and leave when they have (q twice: now).
        Attached to a job started elsewhere (`ddptop attach`): leave at once, the job goes on."""
        if (self.job is None or getattr(self.job, "attached", False) or not self.job.alive()
                or self._stop_deadline is not None):
            self.exit()
            return
        self._stop_deadline = time.monotonic() + STOP_WAIT_S
        self.query_one(StatusHeader).action = "stopping: every rank stops at the next step boundary (q again: now)"
        self._control(control.send_op, "stop")

    def action_toggle_pause(self) -> None:
        if not self.live:
            self.feed.control(self.source.toggle)
            return
        if self.job is not None and self.job.alive():
            op = "resume" if self.state.snapshot().paused else "pause"
            self.query_one(StatusHeader).action = f"{op}: sent"
            self._control(control.send_op, op)

    def action_transport(self, op: str) -> None:
        if not self.live:
            self.on_transport_command(TransportCommand(op))

    def action_seek_input(self) -> None:
        if not self.live:
            self.query_one("#seek").focus()

    # -- messages from the panels and workers --------------------------------------------------------------
    def on_apply_requested(self, message: ApplyRequested) -> None:
        if self.live and self.connect is not None:
            self._control(control.send_set, message.changes)

    def on_tune_requested(self, message: TuneRequested) -> None:
        if self.live and self.connect is not None:
            self._control(control.send_tune, "bucket")

    def on_control_update(self, message: ControlUpdate) -> None:
        if message.op in ("set", "tune"):
            panel = self.query_one(ControlsPanel)
            panel.status = message.text
            if message.segment is not None:
                panel.status_segment = message.segment
            panel.status_kind = {"invalid": "error", "error": "error", "applied": "ok"}.get(message.state, "")
        elif message.op != "stop" or message.state == "error":
            self.query_one(StatusHeader).action = message.text

    def on_rank_chosen(self, message: RankChosen) -> None:
        timeline = self.query_one(TimelinePanel)
        timeline.rank, timeline.step = message.rank, None
        self.action_panel("timeline")

    def on_transport_command(self, message: TransportCommand) -> None:
        self.feed.control(lambda: self._transport(message))
        self.feed.pump()  # show where the seek landed now, not at the next tick
        self.push(force=True)

    def _transport(self, message: TransportCommand) -> None:
        source, status = self.source, self.source.status()
        op, step, current = message.op, status.get("step") or 0, current_segment(status)
        if op == "toggle":
            source.toggle()
        elif op in ("faster", "slower"):
            source.set_speed(next_speed(status.get("speed", 1.0), 1 if op == "faster" else -1))
        elif op in ("back", "forward"):
            source.seek_step(max(0, step + (10 if op == "forward" else -10)))
        elif op == "seek_step":
            source.seek_step(int(message.value))
            self.focus_panel()  # out of the step box, so keys act on the screen again
        elif op in ("segment_prev", "segment_next"):
            count = len(status.get("segments", []))
            if count:
                source.jump_segment(max(0, min(count - 1, current + (1 if op == "segment_next" else -1))))
        self.query_one(TransportBar).status = source.status()

    def _control(self, fn: Callable, arg: Any) -> None:
        if self.connect is None:
            return
        self.run_worker(lambda: fn(self.connect, arg, self.post_message), thread=True, group="control")
