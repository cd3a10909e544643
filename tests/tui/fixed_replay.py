"""A small in-memory replay source over the committed fixture: the ReplaySource API on a virtual clock."""

from __future__ import annotations

import gzip
import json
import os
import time
from typing import Callable

from ddptop.events import ConfigApplied
from ddptop.events import Event, StepDone, event_from_dict

FIXTURE = os.path.join(os.path.dirname(__file__), "data", "session.json.gz")  # tests/tui/make_fixture.py


def event_time(e: Event) -> float:
    """Wall time of an event; a StepSpans has its step's start, so it counts from its last span's end."""
    if hasattr(e, "t"):
        return e.t
    return getattr(e, "t0", 0.0) + max((s.end_s for s in getattr(e, "spans", ())), default=0.0)


def fixture_events() -> list[Event]:
    with gzip.open(FIXTURE, "rt") as fh:
        return [event_from_dict(item) for item in json.load(fh)]


class FixedReplaySource:
    """Plays `events` by their `t`; a seek bumps `generation` and the next poll replays from the start."""

    def __init__(self, events: list[Event], clock: Callable[[], float] = time.monotonic, at_end: bool = False):
        self.events = sorted(events, key=event_time)
        self.t0 = event_time(self.events[0]) if self.events else 0.0
        self.t_end = (event_time(self.events[-1]) - self.t0) if self.events else 0.0
        self.clock = clock
        self.playing, self.speed, self.generation, self.closed = False, 1.0, 0, False
        self.cursor = self.t_end if at_end else 0.0
        self._next = 0
        self._wall = clock()
        self._steps = [(e.step, self._rel(e)) for e in self.events if isinstance(e, StepDone) and e.rank == 0]
        self._segments = [{"index": e.segment, "step": e.step, "t": self._rel(e), "config": e.config}
                          for e in self.events if isinstance(e, ConfigApplied) and e.rank == 0]

    def _rel(self, e: Event) -> float:
        return event_time(e) - self.t0

    @property
    def finished(self) -> bool:
        return self.cursor >= self.t_end and self._next >= len(self.events)

    def poll(self) -> list[Event]:
        now = self.clock()
        if self.playing:
            self.cursor = min(self.t_end, self.cursor + (now - self._wall) * self.speed)
            if self.cursor >= self.t_end:
                self.playing = False
        self._wall = now
        out = []
        while self._next < len(self.events) and self._rel(self.events[self._next]) <= self.cursor:
            out.append(self.events[self._next])
            self._next += 1
        return out

    def close(self) -> None:
        self.closed = True

    def play(self) -> None:
        self._wall, self.playing = self.clock(), True

    def pause(self) -> None:
        self.playing = False

    def toggle(self) -> None:
        self.pause() if self.playing else self.play()

    def set_speed(self, x: float) -> None:
        self.speed = min(16.0, max(0.5, float(x)))

    def seek_time(self, t: float) -> None:
        self.cursor, self._next = min(self.t_end, max(0.0, t)), 0
        self.generation += 1

    def seek_step(self, step: int) -> None:
        """To the moment rank 0 finished `step` (as ddptop's ReplaySource)."""
        self.seek_time(next((t for s, t in self._steps if s >= step), self.t_end))

    def jump_segment(self, index: int) -> None:
        seg = next((s for s in self._segments if s["index"] == index), None)
        if seg is not None:
            self.seek_time(seg["t"])

    def status(self) -> dict:
        """As ReplaySource.status(): `step` is the newest step played (None before the first), `step_end` the last."""
        played = [s for s, t in self._steps if t <= self.cursor]
        return {"playing": self.playing, "speed": self.speed, "t": self.cursor, "t_end": self.t_end,
                "step": max(played) if played else None, "step_end": max((s for s, _ in self._steps), default=None),
                "segments": list(self._segments)}
