"""Provides the messages that travel up to the app: control answers, panel requests, transport commands."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from textual.message import Message


@dataclass
class ControlUpdate(Message):
    """What became of a control request: checking, invalid, pending, applied, accepted, error."""

    op: str
    state: str
    text: str
    segment: int | None = None  # applied: the segment it started


@dataclass
class ApplyRequested(Message):
    """The controls panel asks for these changes (already parsed and typed)."""

    changes: dict[str, Any]


@dataclass
class TuneRequested(Message):
    """The controls panel asks for `tune bucket` (README: What-if / advise)."""


@dataclass
class RankChosen(Message):
    """A rank was picked in the ranks table: show its timeline."""

    rank: int


@dataclass
class SectionsChosen(Message):
    """The sections chooser changed what the overview shows: these are hidden (tui.prefs.SECTIONS' keys)."""

    hidden: frozenset[str]


@dataclass
class TransportCommand(Message):
    """Replay transport: toggle, speed, seek_step, segment."""

    op: str
    value: Any = None
