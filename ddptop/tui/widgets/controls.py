"""Provides the controls panel: strategy, bucket MB, async_op, batch size and Apply; inline errors and progress."""

from __future__ import annotations

from typing import Any, Mapping

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, VerticalScroll
from textual.reactive import reactive
from textual.widgets import Button, Input, Label, Select, Static, Switch

from ddptop.config import STRATEGIES
from ddptop.errors import UsageError
from ddptop.tui.messages import ApplyRequested
from ddptop.tui.widgets.number_input import NumberInput

FIELDS = ("strategy", "bucket", "async", "batch", "apply")


def parse_form(strategy: Any, bucket: str, async_op: bool, batch: str, current: Mapping) -> dict[str, Any]:
    """The changes the form asks for against the config in force; UsageError (one line) for bad input."""
    if strategy not in STRATEGIES:
        raise UsageError("pick a strategy")
    try:
        bucket_mb = float(bucket)
    except ValueError:
        raise UsageError(f"bucket MB must be a number, got {bucket!r}") from None
    try:
        batch_size = int(batch)
    except ValueError:
        raise UsageError(f"batch size must be a whole number, got {batch!r}") from None
    if not 0 < bucket_mb <= 4096:
        raise UsageError(f"bucket MB must be in (0, 4096], got {bucket_mb:g}")
    if batch_size <= 0:
        raise UsageError(f"batch size must be at least 1, got {batch_size}")
    wanted = {"strategy": strategy, "bucket_mb": bucket_mb, "async_op": bool(async_op), "batch_size": batch_size}
    changes = {k: v for k, v in wanted.items() if current.get(k) != v}
    if not changes:
        raise UsageError("nothing to change: that is the config in force")
    return changes


class ControlsPanel(VerticalScroll, can_focus=False):
    DEFAULT_CSS = """
    ControlsPanel { height: 1fr; padding: 0 1; }
    ControlsPanel Horizontal { height: auto; margin-bottom: 1; }
    ControlsPanel #intro { margin-bottom: 1; }
    ControlsPanel Label { width: 14; }
    ControlsPanel Input { width: 16; }
    ControlsPanel Switch { border: none; height: 1; padding: 0; }
    ControlsPanel #async-text { width: 4; margin-left: 1; }
    ControlsPanel Select { width: 24; }
    ControlsPanel #status { height: auto; margin-top: 1; }
    ControlsPanel #status.error { color: $error; }
    ControlsPanel #status.ok { color: $success; }
    """
    BINDINGS = [Binding("up", "app.focus_previous", "Previous field", show=False),
                Binding("down", "app.focus_next", "Next field", show=False)]

    status: reactive[str] = reactive("")
    """Inline outcome: an error, pending, or applied at step k."""
    status_kind: reactive[str] = reactive("")
    """`error`, `ok` or empty: the status line's colour."""

    def __init__(self, enabled: bool, **kwargs):
        super().__init__(**kwargs)
        self.enabled = enabled
        self.current: dict[str, Any] = {}
        self._shown_segment: int | None = None

    def compose(self) -> ComposeResult:
        disabled = not self.enabled
        yield Static("Replay: the controls are disabled; they act on a live job." if disabled else
                     "Change the running job; every rank switches at the same step.", id="intro")
        with Horizontal():
            yield Label("strategy")
            yield Select([(s, s) for s in STRATEGIES], allow_blank=False, value="ddp", id="strategy",
                         disabled=disabled, compact=True)
        with Horizontal():
            yield Label("bucket MB")
            yield NumberInput("25", id="bucket", disabled=disabled, compact=True)
        with Horizontal():
            yield Label("async_op")
            yield Switch(False, id="async", disabled=disabled, animate=False)
            yield Static("off", id="async-text")
        with Horizontal():
            yield Label("batch size")
            yield NumberInput("64", id="batch", disabled=disabled, compact=True)
        yield Button("Apply", id="apply", variant="primary", disabled=disabled, compact=True)
        yield Static("", id="status")

    def show_config(self, config: Mapping, segment: int) -> None:
        """Fill the form with the config in force when a new segment starts (not while the user edits)."""
        self.current = dict(config)
        if segment == self._shown_segment or not config:
            return
        self._shown_segment = segment
        self.query_one("#strategy", Select).value = config.get("strategy", "ddp")
        self.query_one("#bucket", Input).value = f"{config.get('bucket_mb', 25):g}"
        self.query_one("#async", Switch).value = bool(config.get("async_op"))
        self.query_one("#batch", Input).value = str(config.get("batch_size", 64))

    def read(self, current: Mapping) -> dict[str, Any]:
        return parse_form(self.query_one("#strategy", Select).value, self.query_one("#bucket", Input).value,
                          self.query_one("#async", Switch).value, self.query_one("#batch", Input).value, current)

    def watch_status(self, text: str) -> None:
        self.query_one("#status", Static).update(text)

    def watch_status_kind(self, kind: str) -> None:
        status = self.query_one("#status", Static)
        status.set_class(kind == "error", "error")
        status.set_class(kind == "ok", "ok")

    def on_switch_changed(self, event: Switch.Changed) -> None:
        self.query_one("#async-text", Static).update("on" if event.value else "off")

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "apply":
            event.stop()
            self.submit()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.submit()

    def submit(self) -> None:
        """Check the form here (inline error, nothing sent) and ask the app to send what changed."""
        if not self.enabled:
            return
        try:
            changes = self.read(self.current)
        except UsageError as exc:
            self.status, self.status_kind = str(exc), "error"
            return
        self.status, self.status_kind = f"checking {changes} against the job …", ""
        self.post_message(ApplyRequested(changes))
