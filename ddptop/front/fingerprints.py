"""Provides FingerprintCheck: the front compares the model fingerprints every rank reports (pure, no torch).

Ranks must hold the same parameters at the start of every segment (ddptop re-synchronizes them when a
segment follows `single`), except where `single` follows `single`; and at the end of the run unless the last
segment was `single` (with several ranks, each trained alone on its shard: they differ by design).
"""

from __future__ import annotations

import time

from ddptop.events import ConfigApplied, Event, ModelsDiverged, RunFinished


class FingerprintCheck:
    """Feed it every event; it returns a ModelsDiverged for each point where ranks differ but must not."""

    def __init__(self, world_size: int):
        self.world_size = world_size
        self._starts: dict[int, dict[int, str]] = {}  # segment → rank → fingerprint
        self._strategy: dict[int, str] = {}  # segment → strategy
        self._step: dict[int, int] = {}
        self._ends: dict[int, str] = {}
        self._end_step = 0
        self._done: set = set()

    def check(self, events: list[Event]) -> list[Event]:
        out: list[Event] = []
        for e in events:
            if isinstance(e, ConfigApplied) and e.fingerprint:
                self._starts.setdefault(e.segment, {})[e.rank] = e.fingerprint
                self._strategy[e.segment] = str(e.config.get("strategy", "?"))
                self._step[e.segment] = e.step
                out += self._compare(("start", e.segment))
            elif isinstance(e, RunFinished) and e.fingerprint:
                self._ends[e.rank] = e.fingerprint
                self._end_step = max(self._end_step, e.steps)
                out += self._compare(("end", None))
        return out

    def must_agree_at_start(self, segment: int) -> bool:
        previous = self._strategy.get(segment - 1)
        return segment == 0 or self._strategy.get(segment) != "single" or previous != "single"

    def must_agree_at_end(self) -> bool:
        last = max(self._strategy, default=None)
        return last is not None and self._strategy[last] != "single"

    def _compare(self, key: tuple) -> list[Event]:
        where, segment = key
        prints = self._starts.get(segment, {}) if where == "start" else self._ends
        if key in self._done or len(prints) < self.world_size:
            return []
        self._done.add(key)
        agree = self.must_agree_at_start(segment) if where == "start" else self.must_agree_at_end()
        if not agree or len(set(prints.values())) == 1:
            return []
        last = max(self._strategy, default=0)
        return [ModelsDiverged(segment=segment if where == "start" else last,
                               step=self._step.get(segment, 0) if where == "start" else self._end_step,
                               where="segment start" if where == "start" else "end of run",
                               fingerprints={str(r): fp for r, fp in sorted(prints.items())}, t=time.time())]
