"""Provides the replay transport bar: play/pause, speed, seek by step, jump to a segment."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.reactive import reactive
from textual.widgets import Button, Input, Static

from ddptop.tui.messages import TransportCommand
from ddptop.tui.widgets.number_input import NumberInput

SPEEDS = (0.5, 1.0, 2.0, 4.0, 8.0, 16.0)


def next_speed(speed: float, delta: int) -> float:
    i = min(range(len(SPEEDS)), key=lambda k: abs(SPEEDS[k] - speed))
    return SPEEDS[max(0, min(len(SPEEDS) - 1, i + delta))]


def current_segment(status: dict) -> int:
    """The segment the next step runs under: `step` is the newest step played (None before the first)."""
    step = status.get("step")
    upcoming = 0 if step is None else step + 1
    return max((s["index"] for s in status.get("segments") or [] if s.get("step", 0) <= upcoming), default=0)


def status_line(status: dict) -> str:
    """`▶ 2× step 120/400 t 3.1/7.2s segment 2 of 0–3`: steps done and segments counted as the header does."""
    if not status:
        return ""
    mark = "▶" if status.get("playing") else "⏸"
    segments = status.get("segments") or []
    step = status.get("step")
    current = current_segment(status)
    end = status.get("step_end")  # counted as the header counts: steps done (the newest step's index + 1)
    return (f"{mark} {status.get('speed', 1):g}× step {0 if step is None else step + 1}/{0 if end is None else end + 1} "
            f"t {status.get('t', 0):.1f}/{status.get('t_end', 0):.1f}s segment {current if segments else 0}"
            f" of 0–{max(0, len(segments) - 1)}")


class TransportBar(Horizontal):
    DEFAULT_CSS = """
    TransportBar { height: 1; background: $panel; padding: 0 1; }
    TransportBar Button { min-width: 3; width: auto; margin: 0 1 0 0; }
    TransportBar Input { width: 10; }
    TransportBar #transport-status { width: 1fr; padding: 0 1; }
    """

    status: reactive[dict] = reactive(dict, always_update=True)
    """The replay source's status(): playing, speed, t, t_end, step, step_end, segments."""

    def compose(self) -> ComposeResult:
        yield Button("⏯", id="toggle", compact=True, tooltip="play / pause (space)")
        yield Button("-", id="slower", compact=True, tooltip="slower (-)")
        yield Button("+", id="faster", compact=True, tooltip="faster (+)")
        yield Button("⏮", id="seg-prev", compact=True, tooltip="previous segment ([)")
        yield Button("⏭", id="seg-next", compact=True, tooltip="next segment (])")
        yield NumberInput(placeholder="step ⏎", id="seek", type="integer", compact=True)
        yield Static("", id="transport-status")

    def watch_status(self, status: dict) -> None:
        for label in self.query("#transport-status").results(Static):  # none yet before compose
            label.update(status_line(status))

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        op = {"toggle": "toggle", "slower": "slower", "faster": "faster", "seg-prev": "segment_prev",
              "seg-next": "segment_next"}[event.button.id]
        self.post_message(TransportCommand(op))

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        if event.value.strip().lstrip("-").isdigit():
            self.post_message(TransportCommand("seek_step", int(event.value)))
        event.input.value = ""
