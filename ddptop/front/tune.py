"""Provides the front's tuner (`--tune bucket|strategy`, `ddptop ctl tune bucket|strategy`): the what-if model's best
bucket sizes of DDP (or zero1: DDP's buckets under a sharded optimizer), or the strategies ddp, zero1, zero2 and zero3,
tried as short live segments through the path `ddptop ctl set …` takes, the fastest kept, the outcome a TuneNote
event in the job's stream (so the screen, the printed lines and the recording get it like any other)."""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

from ddptop.events import Event, RunStarted, TuneAsked, TuneNote, TuneTrial
from ddptop.metrics import tune
from ddptop.metrics.tables import describe
from ddptop.safe import clean
from ddptop.testhooks import tune_steps

POLL_S = 0.2  # the feed applies events every 0.2 s (front.feed.POLL_S): looking more often finds nothing new
FIT_WAIT_S = 300.0  # the segment in force must fit (a sampled step: every 10th) and hold STEPS steps after warm-up
TRIAL_WAIT_S = 300.0  # a trial's STEPS steps: VGG-11 at 2 s/step on the lab's hosts takes ~50 s
JOIN_S = 15.0  # close() waits this long for the tuner's note (a call to the front gives up after 10 s)
NO_TRIAL = TuneTrial(0, 0.0, 0, 0, 0.0)


class Stopped(Exception):
    """The tune cannot go on; the note says why."""


class Interrupted(Stopped):
    """Another request changed the job during the tune: the next trial would measure another configuration."""


class Tuner:
    """A sink of the front's feed: starts a tune when rank 0 hands one on (TuneAsked) or, with `auto` ("bucket" or
    "strategy"; "": none), when the run starts; one at a time. `client()` makes a control client of the job
    (front.supervisor's); `state` (a SharedState) and `derived` (front.pipeline.Derived) are set by
    front.pipeline.compose."""

    def __init__(self, client: Callable[[], Any], auto: str = "", trials: int = tune.TRIALS, steps: int = 0):
        """`steps`: measured per trial; 0: metrics.tune.STEPS (or the test suite's testhooks.tune_steps)."""
        self.client, self.auto, self.trials = client, auto, trials
        self.steps = steps or tune_steps() or tune.STEPS
        self.state = self.derived = None
        self._halt = threading.Event()
        self._thread: threading.Thread | None = None
        self._request = 0
        self._client = None  # the tuner thread's own control client
        self._start_trial = NO_TRIAL
        self._what = "bucket"  # what the tune under way tunes (events.TUNABLE)
        self._base: dict | None = None  # the start's configuration: every trial is it but for what `_what` varies
        self._since = -1  # segments after this one are the tune's own trials, or an interruption
        self._last: dict | None = None  # the changes of the tuner's newest applied set (None: none yet)
        self._pending: tuple[int, dict] | None = None  # the tuner's set not yet applied: (request id, its changes)

    def handle(self, events: list[Event]) -> None:
        for e in events:
            if isinstance(e, RunStarted) and self.auto and self._thread is None:
                self._start(0, self.auto)
            elif isinstance(e, TuneAsked) and e.rank == 0:  # only rank 0 reads requests (control.agent)
                if self._thread is not None and self._thread.is_alive():
                    self._say(e.request_id, {"ok": False, "error": "a tune is already running (asked by "
                                             f"{'request ' + str(self._request) if self._request else '--tune'})"})
                else:
                    self._start(e.request_id, e.what)

    def _start(self, request_id: int, what: str) -> None:
        self._request = request_id
        self._thread = threading.Thread(target=self._run, args=(request_id, what), name="ddptop-tune", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Before the feed's last drain: the run is ending, a tune still running stops and leaves its note."""
        self._halt.set()
        if self._thread is not None:
            self._thread.join(timeout=JOIN_S)

    def _run(self, request_id: int, what: str) -> None:
        trials: list[TuneTrial] = []
        self._start_trial, self._base, self._since, self._last, self._pending = NO_TRIAL, None, -1, None, None
        self._what = what
        try:
            note = self._tune(request_id, trials)
        except Exception as exc:  # Stopped; the front went away; a bug: said in the note, never a thread's traceback
            why = str(exc) if isinstance(exc, Stopped) else f"{type(exc).__name__}: {exc}"
            note = TuneNote(request_id, self._start_trial, tuple(trials), 0.0, 0.0, why + self._restore(),
                            time.time(), what=what)
        if self.derived is not None:
            self.derived.add([note])  # out with the next pump, or the feed's last drain (close() joined us)
        if request_id:
            ok = note.kept
            self._say(request_id, {"ok": ok, "state": "tuned" if ok else "failed", "line": note.describe(),
                                   "error": note.reason, "what": what, "kept_mb": note.kept_mb,
                                   "kept_strategy": note.kept_strategy, "gain_s": note.gain_s})

    def _tune(self, request_id: int, trials: list[TuneTrial]) -> TuneNote:
        if self._what == "strategy":
            return self._tune_strategy(request_id, trials)
        snap, fig = self._wait(self._fitted, FIT_WAIT_S, "the what-if model did not fit the segment in force")
        start = self._begin(snap, fig)
        sizes = tune.candidates(snap.whatif.rows, snap.world_size, start.bucket_mb, self.trials)
        if not sizes:
            raise Stopped("the what-if model predicts no other bucket size")
        for mb in sizes:
            trials.append(self._trial({"bucket_mb": mb}))
        grid = tune.ddp_sizes(snap.whatif.rows, snap.world_size)
        while len(trials) < tune.MAX_TRIALS:  # then toward the side the measurements found faster
            mb = tune.next_size(grid, {start.bucket_mb: start.step_s, **{t.bucket_mb: t.step_s for t in trials}})
            if mb is None:
                break
            trials.append(self._trial({"bucket_mb": mb}))
        best = tune.kept(start, trials)
        if best.bucket_mb != trials[-1].bucket_mb:
            self._switch({"bucket_mb": best.bucket_mb})
        return TuneNote(request_id, start, tuple(trials), best.bucket_mb, start.step_s - best.step_s, "", time.time())

    def _tune_strategy(self, request_id: int, trials: list[TuneTrial]) -> TuneNote:
        """ddp, zero1, zero2 and zero3 (but the one in force: the start measures it), each a live segment on the
        same batch; the fastest kept as `_tune`'s sizes are. No what-if fit is waited for: FSDP2's segments have none
        (metrics.whatif.inputs), and every strategy is measured."""
        snap, fig = self._wait(self._steady, FIT_WAIT_S, f"the segment in force did not hold {self.steps} steps")
        start = self._begin(snap, fig)
        for strategy in tune.strategies(start.strategy):
            trials.append(self._trial({"strategy": strategy}))
        best = tune.kept(start, trials)
        if best.strategy != trials[-1].strategy:
            back = self._but_same(self._start_changes(), self.state.snapshot().config)
            self._switch(back if best is start else {"strategy": best.strategy})
        return TuneNote(request_id, start, tuple(trials), 0.0, start.step_s - best.step_s, "", time.time(),
                        what="strategy", kept_strategy=best.strategy)

    def _begin(self, snap, fig) -> TuneTrial:
        """The segment in force measured as the tune's start; from here on a foreign segment ends the tune."""
        first, last = tune.start_steps(snap.history, fig.index, fig.first_step, fig.warmup, self.steps)
        self._start_trial = self._measure(snap, fig.index, first, last)
        self._base, self._since = dict(snap.config), fig.index
        return self._start_trial

    def _measure(self, snap, segment: int, first: int, last: int) -> TuneTrial | None:
        """Steps first..last of `segment` as a trial (None until every rank reported them), with the segment's
        memory per rank when its samples came (they come at its first step, before those steps: probes.memory;
        0 under --probes off)."""
        found = tune.measured(snap.history, snap.world_size, segment, first, last)
        if found is None:
            return None
        config = next((s.config for s in snap.segments if s.index == segment), snap.config)
        held, peak = tune.memory(snap.memory, segment, snap.world_size) or (0, 0)
        return TuneTrial(segment, float(config.get("bucket_mb", 25.0)), first, last, *found,
                         strategy=str(config.get("strategy", "")), held_bytes=held, peak_bytes=peak)

    def _trial(self, changes: dict) -> TuneTrial:
        """The start's configuration with `changes` as a live segment, measured over its fixed window of steps after
        its warm-up."""
        segment = self._switch(changes)
        fig = self._wait(lambda s: next((f for f in s.segment_figures if f.index == segment), None),
                         TRIAL_WAIT_S, f"segment {segment} did not start")
        first, last = tune.trial_steps(fig.first_step, fig.warmup, self.steps)
        return self._wait(lambda s: self._measure(s, segment, first, last), TRIAL_WAIT_S,
                          f"{_said(changes)}'s {self.steps} steps did not come")

    def _fitted(self, snap):
        """(snapshot, its segment in force's figures) once the model fits that segment on DDP's buckets (ddp, or
        zero1: DDP's buckets under a sharded optimizer) and it holds the steps to measure the start on; else None."""
        seg = snap.whatif.seg
        if seg is None or seg.segment != snap.segment or snap.config.get("strategy") not in tune.BUCKETED:
            return None
        return self._steady(snap)

    def _steady(self, snap):
        """(snapshot, its segment in force's figures) once that segment holds the steps to measure the start on."""
        fig = next((f for f in snap.segment_figures if f.index == snap.segment), None)
        if fig is None or tune.start_steps(snap.history, fig.index, fig.first_step, fig.warmup, self.steps) is None:
            return None
        return snap, fig

    def _switch(self, changes: dict) -> int:
        """`set` of `changes` as `ddptop ctl set` sends it; the segment it started once every rank applied it."""
        request_id = self._control().request("set", changes)
        self._pending = (request_id, changes)
        try:
            segment = self._applied(request_id, changes)
        except Interrupted:
            raise  # still queued at rank 0: _restore lets it land before deciding
        except Exception:
            self._pending = None  # refused, or never applied: the configuration in force is the one before
            raise
        self._pending, self._last = None, changes
        return segment

    def _applied(self, request_id: int, changes: dict) -> int:
        """The segment the tuner's request `request_id` (a set of `changes`) started, once every rank applied it."""
        client = self._control()

        def applied(_snap):
            answer = client.poll(request_id)
            if answer is not None and (not answer.get("ok") or answer.get("state") == "rolled back"):
                raise Stopped(f"{_said(changes)} was refused: {answer.get('error')}")
            return answer if answer is not None and answer.get("state") == "applied" else None

        answer = self._wait(applied, TRIAL_WAIT_S, f"{_said(changes)} was not applied")
        client.forget(request_id)  # read for the last time, as `ctl set` does
        return int(answer["segment"])

    def _wait(self, found: Callable[[Any], Any], timeout_s: float, late: str) -> Any:
        """`found(snapshot)` once it is not None; Stopped when the run ends or `timeout_s` passes first."""
        deadline = time.monotonic() + timeout_s
        while True:
            if self._halt.is_set():
                raise Stopped("the run ended during the tune")
            snap = self.state.snapshot()
            self._check_segments(snap)
            value = found(snap)
            if value is not None:
                return value
            if snap.finished:
                raise Stopped("the run ended during the tune")
            if time.monotonic() > deadline:
                raise Stopped(f"{late} within {timeout_s:g} s")
            self._halt.wait(POLL_S)

    def _check_segments(self, snap) -> None:
        """Interrupted when a segment since the start is not one of the tune's own trials: another client's `set`
        (or a request merged with the tune's during a pause) changed the job, and a trial measured from now on
        would measure that configuration under a trial's label. A tune's own segment runs the start's configuration
        but for what the tune varies (metrics.tune.VARIES)."""
        if self._base is None:
            return
        mine = clean(self._control().who, 120)  # as rank 0 records it (control.commands.read_request)
        seg = tune.foreign(snap.segments, self._since, mine, self._base, self._what)
        if seg is not None:
            raise Interrupted(f"segment {seg.index} ({describe(seg.config)}, asked by {seg.who}) changed the job "
                              "during the tune")

    def _restore(self) -> str:
        """After a tune that stopped while the job runs on one of its trials: the start's configuration of what the
        tune varies, set again (the rest of the configuration in force stays); what happened, as the end of the
        note's reason. A configuration someone else set since (another bucket size or strategy), or a run that
        ended, is left as it is."""
        base, self._base = self._base, None  # no longer checking: the switch back is the tuner's own
        pending, self._pending = self._pending, None
        if base is None or (self._last is None and pending is None) or self._halt.is_set() \
                or self.state.snapshot().finished:
            return ""
        back = self._start_changes(base)
        try:
            if pending is not None:  # the tuner's own set, still queued at rank 0, lands first: then decide
                segment = self._applied(*pending)
                self._last = pending[1]
                self._wait(lambda s: s.segment >= segment or None, TRIAL_WAIT_S, f"segment {segment} did not start")
            config = self.state.snapshot().config
            last = {"strategy": base.get("strategy"), **self._last}
            if any(config.get(k) != v for k, v in last.items()) or all(config.get(k) == v for k, v in back.items()):
                return ""  # someone else's configuration since, or already the start's
            self._switch(self._but_same(back, config))
        except Exception as exc:  # the run ended, or the switch back was refused: the note says which
            return f"; could not go back to {self._start_said()} ({exc})"
        return f"; back on {self._start_said()}"

    def _start_changes(self, base: dict | None = None) -> dict:
        """The `set` that puts the start's configuration of what the tune varies back."""
        base = self._base if base is None else base
        if self._what == "bucket":
            return {"bucket_mb": self._start_trial.bucket_mb}
        return {k: base[k] for k in tune.VARIES["strategy"] if k in base}

    @staticmethod
    def _but_same(changes: dict, config: dict) -> dict:
        """`changes` less what `config` already holds, but never less its strategy (a switch's own key): async_op
        or compress named to a strategy that does not take them would be refused."""
        return {k: v for k, v in changes.items() if k == "strategy" or config.get(k) != v} or changes

    def _start_said(self) -> str:
        start = self._start_trial
        return f"{start.bucket_mb:g} MB" if self._what == "bucket" else start.strategy

    def _control(self):
        if self._client is None:
            self._client = self.client()
        return self._client

    def _say(self, request_id: int, answer: dict) -> None:
        """The outcome to the `ctl` that asked (the tuner's thread), or a refusal (the feed's: a client of its own)."""
        try:
            (self._control() if threading.current_thread() is self._thread else self.client()).say(request_id, answer)
        except Exception:  # the ctl that asked is told nothing more; its own timeout or the job's end answers it
            pass


def _said(changes: dict) -> str:
    """A tuner's set as `ddptop ctl set` would spell it: bucket_mb=25, strategy=zero3."""
    return ", ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in changes.items())
