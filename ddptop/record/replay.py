"""ReplaySource: a recording played back as a Source (poll/close), with a transport: play, pause, speed, seek.

The playback clock runs on the recording's own `at` times (see schema.py) scaled by the speed; `poll()`
returns the events whose time has come, in recorded order, so a UI cannot tell it from a live job.

After any seek, `generation` goes up by one and the next `poll()` starts with a *history*: every rare event
up to the new position (joins, run start, config switches, epochs, logs, lost ranks), the last
`history_steps` StepDone of every rank, the last sampled StepSpans of each rank and `history_s` seconds of
system samples, in recorded order. A UI that sees `generation` change clears its state and applies that
poll's events as if they had just arrived.
"""

from __future__ import annotations

import math
import threading
import time
from typing import Any

from ddptop.events import Event, StepDone
from ddptop.record.reader import Recording

MIN_SPEED, MAX_SPEED = 0.5, 16.0


class ReplaySource:
    def __init__(self, path: str, speed: float = 1.0, playing: bool = True, history_steps: int = 200,
                 history_s: float = 30.0):
        self.recording = Recording.open(path)
        self.path = path
        self.history_steps = history_steps
        self.history_s = history_s
        self.generation = 0
        self._lock = threading.RLock()
        self._speed = _clamp(speed)
        self._playing = playing
        self._t = 0.0  # playback position, seconds from the start
        self._released = -math.inf  # every event with at ≤ this has been returned
        self._wall: float | None = None  # monotonic time of the last clock update; None until the first poll
        self._pending: list[Event] = []
        self._step: int | None = None
        self._segments = [{k: s[k] for k in ("index", "step", "t", "config")} for s in self.recording.segments()]

    # -- Source ---------------------------------------------------------------------------------------------
    def poll(self) -> list[Event]:
        with self._lock:
            self._advance()
            target = self.recording.start + self._t
            out, self._pending = self._pending, []
            if target > self._released or self._released == -math.inf:
                out += self.recording.between(self._released, target)
                self._released = target
            self._note_steps(out)
            if self._t >= self.t_end:
                self._playing = False
            return out

    def close(self) -> None:
        with self._lock:
            self.recording.close()

    # -- transport ------------------------------------------------------------------------------------------
    def play(self) -> None:
        with self._lock:
            self._advance()
            if self._t >= self.t_end:  # play at the end starts over, as media players do
                self._seek(0.0)
            self._playing = True

    def pause(self) -> None:
        with self._lock:
            self._advance()
            self._playing = False

    def toggle(self) -> None:
        with self._lock:
            self.pause() if self._playing else self.play()

    def set_speed(self, x: float) -> None:
        """Playback speed, clamped to 0.5-16×."""
        with self._lock:
            self._advance()
            self._speed = _clamp(x)

    def seek_time(self, t: float) -> None:
        """Jump to `t` seconds from the start (clamped to the recording)."""
        with self._lock:
            self._seek(t)

    def seek_step(self, step: int) -> None:
        """Jump to the moment every rank had finished `step` (clamped to the recorded steps)."""
        with self._lock:
            rec = self.recording
            if rec.first_step is None:
                return self._seek(0.0)
            step = min(max(int(step), rec.first_step), rec.last_step)
            at = rec.time_of_step(step)
            self._seek((at if at is not None else rec.start) - rec.start)

    def jump_segment(self, index: int) -> None:
        """Jump to where segment `index` starts (the switch itself is part of the history)."""
        with self._lock:
            match = [s for s in self._segments if s["index"] == index]
            if match:
                self._seek(match[0]["t"])

    def status(self) -> dict[str, Any]:
        with self._lock:
            self._advance()
            rec = self.recording
            return {"playing": self._playing, "speed": self._speed, "t": self._t, "t_end": self.t_end,
                    "step": self._step, "step_end": rec.last_step, "segments": list(self._segments),
                    "generation": self.generation, "finished": self.finished}

    @property
    def t_end(self) -> float:
        return self.recording.duration

    @property
    def finished(self) -> bool:
        """Everything has been returned by poll() (until a seek or play starts over)."""
        with self._lock:
            return not self._pending and self._released >= self.recording.end

    # -- internals ------------------------------------------------------------------------------------------
    def _advance(self) -> None:
        now = time.monotonic()
        if self._playing and self._wall is not None:
            self._t = min(self._t + (now - self._wall) * self._speed, self.t_end)
        self._wall = now

    def _seek(self, t: float) -> None:
        self._advance()
        self._t = min(max(0.0, float(t)), self.t_end)
        at = self.recording.start + self._t
        self._pending = self.recording.history(at, self.history_steps, self.history_s)
        self._released = at
        self._step = self.recording.step_at_time(at)
        self.generation += 1

    def _note_steps(self, events: list[Event]) -> None:
        for event in events:
            if isinstance(event, StepDone) and (self._step is None or event.step > self._step):
                self._step = event.step


def _clamp(x: float) -> float:
    x = float(x)
    if not math.isfinite(x):
        return MAX_SPEED if x > 0 else MIN_SPEED
    return min(max(x, MIN_SPEED), MAX_SPEED)
