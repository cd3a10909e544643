"""Provides the live what-if (issue 23): the model fitted on the segment in force from the session's own events,
the table `ddptop advise` prints, and after every switch the prediction made for the new configuration beside its
measurement (pure: ddptop.metrics.whatif's inputs and rows, the ones advise calls on a recording)."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, replace
from typing import Any, Callable, Mapping

from ddptop.metrics.whatif.data import SegmentData
from ddptop.metrics.whatif.inputs import NoFit, segment_input, step_row
from ddptop.metrics.whatif.rows import (best_row, config_name, error_se, measured_steps, name, prediction_rows,
                                        row_for)

# A fit costs ~10 ms of the screen's thread (README "What-if panel"); a tiny model samples a step every 20 ms, so
# the view is redone at most every REFIT_S as steps come in (at once for a new segment or a switch)
REFIT_S = 3.0
# The model's stated error, README "What-if / advise": predicted-vs-measured medians reach 10.6% and maxima 25.4%
# on the committed lab recordings, a fresh whatif-lab job 12.5% / 21.8%; the panel quotes it beside its own
STATED_ERROR = "median ≤ 10.6%, max ≤ 25.4% on the committed lab recordings (12.5% / 21.8% on a fresh one)"


@dataclass(frozen=True)
class Check:
    """One switch: the prediction for the new segment's configuration, made from the segment before it."""

    segment: int
    config: str  # in the rows' words ("ddp 10 MB")
    from_segment: int
    predicted_s: float
    measured_s: float | None = None  # the segment's slowest rank's mean step time, once it has measured steps
    predicted_se_s: float = 0.0  # the fitted segment's standard error, which the prediction inherits
    measured_se_s: float = 0.0  # the new segment's own

    @property
    def error(self) -> float | None:
        return None if not self.measured_s else (self.predicted_s - self.measured_s) / self.measured_s

    @property
    def error_se(self) -> float:
        """The error's standard error from both segments' step-to-step noise (rows.error_se)."""
        return error_se(self.predicted_se_s, self.measured_se_s, self.measured_s or 0.0)


@dataclass(frozen=True)
class WhatIf:
    """What the What-if panel and the overview's line draw. `rows`: advise's rows (empty until a segment fits)."""

    seg: SegmentData | None = None
    rows: tuple[dict[str, Any], ...] = ()
    best: dict[str, Any] | None = None  # rows.best_row: the fastest on the run's world size, with "saving_s"
    checks: tuple[Check, ...] = ()
    why: str = "no segment has measured steps yet"  # why there is no table, when there is none
    unchecked: int = 0  # switches with no prediction: no earlier segment in view fitted (a replay's seek skips them)
    cost_s: float = 0.0  # the last fit's time on the caller's thread

    @property
    def errors(self) -> list[float]:
        return [abs(c.error) for c in self.checks if c.error is not None]

    @property
    def running(self) -> tuple[float, float] | None:
        """(median, max) absolute error over every checked switch so far."""
        e = self.errors
        return (statistics.median(e), max(e)) if e else None


class Advisor:
    """Keeps the fits (one per segment, redone as the segment grows) and the prediction made at each switch."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._fits: dict[int, tuple[tuple, SegmentData | None, list, str]] = {}  # segment → (key, seg, rows, why)
        self._predicted: dict[int, Check | None] = {}  # segment → the prediction made when it started
        self._view = WhatIf()
        self._spans_seen: tuple = ()
        self._viewed_at = -1e9
        self._tried = 0  # the newest segment a prediction was tried for

    def due(self, state, table: tuple) -> bool:
        """Whether the view is to be redone: at once for a switch never predicted or a segment never fitted, else
        at most every REFIT_S (or once the run has finished) when new steps came in. `table`: the state's segment
        table (state.table.segments()), as the snapshot holds it."""
        unsettled = self._unsettled(state)
        if unsettled and unsettled[-1] > self._tried:
            return True
        fig = _in_force(state, table)
        if fig is not None and fig.index not in self._fits:
            return True
        if self.clock() - self._viewed_at < REFIT_S and not state_finished(state):
            return False
        old = self._fits.get(fig.index) if fig is not None else None
        return (old is not None and old[0] != _key(state, fig)) or (
            bool(unsettled) and self._spans_seen != _spans_seen(state))  # spans that may let an earlier one fit

    def view(self, state, table: tuple) -> WhatIf:
        """The view as of `state` (a SessionState) and its segment `table`: refits only when `due`."""
        if not self.due(state, table):  # the switches' measurements move with every step: no refit for them
            checks = self._checks(table)
            if checks != self._view.checks:
                self._view = replace(self._view, checks=checks)
            return self._view
        start = self._viewed_at = self.clock()
        fig = _in_force(state, table)
        self._spans_seen = _spans_seen(state)
        self._tried = max(state.segments, default=0)
        for index in self._unsettled(state):  # the switches not yet predicted, oldest first
            self._predict(state, table, index)
        seg, rows, why = self._fit(state, table, fig) if fig is not None else (None, [], WhatIf.why)
        if seg is None:  # the segment in force cannot be fitted (yet): the newest one that could
            seg, rows = next(((s, r) for _, (_, s, r, _) in sorted(self._fits.items(), reverse=True) if s), (None, []))
        checks = self._checks(table)
        self._view = WhatIf(seg, tuple(rows), best_row(rows, seg) if rows else None, checks, why,
                            max(0, len(state.segments) - 1 - len(checks)), self.clock() - start)
        return self._view

    def _fit(self, state, table: tuple, fig) -> tuple[SegmentData | None, list, str]:
        key = _key(state, fig)
        old = self._fits.get(fig.index)
        if old is not None and old[0] == key:
            return old[1], old[2], old[3]
        seg, rows, why = None, [], ""
        run = state.run
        if run is None or not run.layers or run.param_bytes <= 0:
            why = "the run's parameter layout is not known"
        else:
            first = fig.first_step + fig.warmup
            steps = [step_row(d) for h in state.history.values() for d in h
                     if d.segment == fig.index and d.step >= first and not d.sampled]
            try:
                seg = segment_input(fig, run, _world(state), steps, state.spans.values(), table=table)
                rows = prediction_rows(seg, measured_steps(table))
            except (NoFit, ValueError, KeyError, ZeroDivisionError) as exc:
                seg, why = None, str(exc).replace("pick another --segment", "it will fit once one is sampled")
        self._fits[fig.index] = (key, seg, rows, why)
        return seg, rows, why

    def _predict(self, state, table: tuple, index: int) -> None:
        """The prediction for segment `index`'s configuration from the newest earlier segment that fits; none yet
        while no earlier one does (a replay's seek can bring the switches before the steps: tried again later)."""
        figures = {f.index: f for f in table if f.measured_steps}
        cfg = dict(state.segments[index].config)
        for earlier in sorted((i for i in figures if i < index), reverse=True):
            seg, rows, _ = self._fit(state, table, figures[earlier])
            if seg is not None:  # settled: no row means the model does not predict it (another batch size)
                row = row_for(rows, cfg, seg)
                # a prediction that cannot be (rows: "n_a") is no prediction to check
                self._predicted[index] = None if row is None or row["step_s"] is None else Check(
                    index, config_name(cfg), earlier, row["step_s"], predicted_se_s=row["step_se_s"])
                return

    def _unsettled(self, state) -> list[int]:
        """Segments started by a switch that have no prediction yet (nor a reason never to have one)."""
        first = min(state.segments, default=0)
        return [i for i in sorted(state.segments) if i > first and i not in self._predicted]

    def _checks(self, table: tuple) -> tuple[Check, ...]:
        measured = {i: (step, se) for i, _, step, se in measured_steps(table)}
        return tuple(replace(c, measured_s=measured[c.segment][0], measured_se_s=measured[c.segment][1])
                     if c.segment in measured else c for i, c in sorted(self._predicted.items()) if c is not None)


def _in_force(state, table: tuple):
    """The segment table's row of the segment in force, once it has measured steps."""
    index = max(state.segments, default=0)
    return next((f for f in table if f.index == index and f.measured_steps), None)


def _key(state, fig) -> tuple:
    """(segment, its kept sampled steps, its measured steps): a fit holds as long as this does."""
    spans = sum(1 for e in state.spans.values() if e.segment == fig.index)
    return fig.index, spans, fig.measured_steps


def state_finished(state) -> bool:
    """Every rank has ended: nothing more will come, so nothing is put off."""
    return bool(state.ranks) and all(r.state in ("done", "stopped", "error", "lost") for r in state.ranks.values())


def _spans_seen(state) -> tuple:
    """How many sampled steps the state keeps and the newest one's key: changes with every StepSpans."""
    return len(state.spans), next(reversed(state.spans), None)


def _world(state) -> int:
    return state.run.world_size if state.run else len(state.ranks)


def describe(best: Mapping[str, Any]) -> str:
    """The best configuration (rows.best_row) and its gain in a few words: "ddp 5 MB, −127 ms/step (15%)
    predicted", "ddp 5 MB, −9 ms/step (7%) measured (#2)", or why there is none ("no better within noise")."""
    gain, step = best["saving_s"], best["fitted_step_s"]
    verdict = best.get("verdict", "faster" if gain > 0 else "in force")
    if verdict == "in force" or best.get("segment") == best.get("from_segment"):  # its own row: 0 ms of rounding
        return f"{name(dict(best))}, the configuration in force, is fastest"
    by = "measured (#{})".format(best["segment"]) if best.get("by") == "measured" else "predicted"
    said = f"{name(dict(best))}, −{gain * 1e3:.0f} ms/step ({gain / step if step > 0 else 0.0:.0%}) {by}"
    if verdict == "noise":
        return f"no better within noise: {said}, inside ±{best['noise_s'] * 1e3:.0f} ms"
    return said
