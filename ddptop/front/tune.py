"""Provides the front's tuner (`--tune bucket`, `ddptop ctl tune bucket`): the what-if model's best DDP bucket sizes
tried as short live segments through the path `ddptop ctl set bucket_mb=…` takes, the fastest kept, the outcome a
TuneNote event in the job's stream (so the screen, the printed lines and the recording get it like any other)."""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

from ddptop.events import Event, RunStarted, TuneAsked, TuneNote, TuneTrial
from ddptop.metrics import tune
from ddptop.metrics.tables import describe
from ddptop.safe import clean

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
    """A sink of the front's feed: starts a tune when rank 0 hands one on (TuneAsked) or, with `auto`, when the run
    starts; one at a time. `client()` makes a control client of the job (front.supervisor's); `state` (a
    SharedState) and `derived` (front.pipeline.Derived) are set by front.pipeline.compose."""

    def __init__(self, client: Callable[[], Any], auto: bool = False, trials: int = tune.TRIALS,
                 steps: int = tune.STEPS):
        self.client, self.auto, self.trials, self.steps = client, auto, trials, steps
        self.state = self.derived = None
        self._halt = threading.Event()
        self._thread: threading.Thread | None = None
        self._request = 0
        self._client = None  # the tuner thread's own control client
        self._start_trial = NO_TRIAL
        self._base: dict | None = None  # the start's configuration: every trial is it but for bucket_mb
        self._since = -1  # segments after this one are the tune's own trials, or an interruption
        self._last_mb = 0.0  # the size the tuner's newest applied set gave (0: none yet)
        self._pending: tuple[int, float] | None = None  # the tuner's set not yet applied: (request id, its size)

    def handle(self, events: list[Event]) -> None:
        for e in events:
            if isinstance(e, RunStarted) and self.auto and self._thread is None:
                self._start(0)
            elif isinstance(e, TuneAsked) and e.rank == 0:  # only rank 0 reads requests (control.agent)
                if self._thread is not None and self._thread.is_alive():
                    self._say(e.request_id, {"ok": False, "error": "a tune is already running (asked by "
                                             f"{'request ' + str(self._request) if self._request else '--tune'})"})
                else:
                    self._start(e.request_id)

    def _start(self, request_id: int) -> None:
        self._request = request_id
        self._thread = threading.Thread(target=self._run, args=(request_id,), name="ddptop-tune", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Before the feed's last drain: the run is ending, a tune still running stops and leaves its note."""
        self._halt.set()
        if self._thread is not None:
            self._thread.join(timeout=JOIN_S)

    def _run(self, request_id: int) -> None:
        trials: list[TuneTrial] = []
        self._start_trial, self._base, self._since, self._last_mb, self._pending = NO_TRIAL, None, -1, 0.0, None
        try:
            note = self._tune(request_id, trials)
        except Exception as exc:  # Stopped; the front went away; a bug: said in the note, never a thread's traceback
            why = str(exc) if isinstance(exc, Stopped) else f"{type(exc).__name__}: {exc}"
            note = TuneNote(request_id, self._start_trial, tuple(trials), 0.0, 0.0, why + self._restore(),
                            time.time())
        if self.derived is not None:
            self.derived.add([note])  # out with the next pump, or the feed's last drain (close() joined us)
        if request_id:
            ok = bool(note.kept_mb)
            self._say(request_id, {"ok": ok, "state": "tuned" if ok else "failed", "line": note.describe(),
                                   "error": note.reason, "kept_mb": note.kept_mb, "gain_s": note.gain_s})

    def _tune(self, request_id: int, trials: list[TuneTrial]) -> TuneNote:
        snap, fig = self._wait(self._fitted, FIT_WAIT_S, "the what-if model did not fit the segment in force")
        start_mb = float(snap.config.get("bucket_mb", 25.0))
        first, last = tune.start_steps(snap.history, fig.index, fig.first_step, fig.warmup, self.steps)
        start = self._start_trial = TuneTrial(fig.index, start_mb, first, last,
                                              *tune.measured(snap.history, snap.world_size, fig.index, first, last))
        self._base, self._since = dict(snap.config), fig.index  # from here on a foreign segment ends the tune
        sizes = tune.candidates(snap.whatif.rows, snap.world_size, start_mb, self.trials)
        if not sizes:
            raise Stopped("the what-if model predicts no other bucket size")
        for mb in sizes:
            trials.append(self._trial(mb))
        grid = tune.ddp_sizes(snap.whatif.rows, snap.world_size)
        while len(trials) < tune.MAX_TRIALS:  # then toward the side the measurements found faster
            mb = tune.next_size(grid, {start.bucket_mb: start.step_s, **{t.bucket_mb: t.step_s for t in trials}})
            if mb is None:
                break
            trials.append(self._trial(mb))
        best = tune.kept(start, trials)
        if best.bucket_mb != trials[-1].bucket_mb:
            self._switch(best.bucket_mb)
        return TuneNote(request_id, start, tuple(trials), best.bucket_mb, start.step_s - best.step_s, "", time.time())

    def _trial(self, mb: float) -> TuneTrial:
        """`mb` as a live segment, measured over its fixed window of steps after its warm-up."""
        segment = self._switch(mb)
        fig = self._wait(lambda s: next((f for f in s.segment_figures if f.index == segment), None),
                         TRIAL_WAIT_S, f"segment {segment} did not start")
        first, last = tune.trial_steps(fig.first_step, fig.warmup, self.steps)
        found = self._wait(lambda s: tune.measured(s.history, s.world_size, segment, first, last), TRIAL_WAIT_S,
                           f"{mb:g} MB's {self.steps} steps did not come")
        return TuneTrial(segment, mb, first, last, *found)

    def _fitted(self, snap):
        """(snapshot, its segment in force's figures) once the model fits that segment on DDP and it holds the
        steps to measure the start on; else None."""
        seg = snap.whatif.seg
        if seg is None or seg.segment != snap.segment or snap.config.get("strategy") != "ddp":
            return None
        fig = next((f for f in snap.segment_figures if f.index == snap.segment), None)
        if fig is None or tune.start_steps(snap.history, fig.index, fig.first_step, fig.warmup, self.steps) is None:
            return None
        return snap, fig

    def _switch(self, mb: float) -> int:
        """`set bucket_mb=mb` as `ddptop ctl set` sends it; the segment it started once every rank applied it."""
        request_id = self._control().request("set", {"bucket_mb": mb})
        self._pending = (request_id, mb)
        try:
            segment = self._applied(request_id, mb)
        except Interrupted:
            raise  # still queued at rank 0: _restore lets it land before deciding
        except Exception:
            self._pending = None  # refused, or never applied: the size in force is the one before
            raise
        self._pending, self._last_mb = None, mb
        return segment

    def _applied(self, request_id: int, mb: float) -> int:
        """The segment the tuner's request `request_id` (bucket_mb=mb) started, once every rank applied it."""
        client = self._control()

        def applied(_snap):
            answer = client.poll(request_id)
            if answer is not None and (not answer.get("ok") or answer.get("state") == "rolled back"):
                raise Stopped(f"bucket_mb={mb:g} was refused: {answer.get('error')}")
            return answer if answer is not None and answer.get("state") == "applied" else None

        answer = self._wait(applied, TRIAL_WAIT_S, f"bucket_mb={mb:g} was not applied")
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
        would measure that configuration under a bucket size's label. A tune's own segment runs the start's
        configuration but for bucket_mb."""
        if self._base is None:
            return
        mine = clean(self._control().who, 120)  # as rank 0 records it (control.commands.read_request)
        seg = tune.foreign(snap.segments, self._since, mine, self._base)
        if seg is not None:
            raise Interrupted(f"segment {seg.index} ({describe(seg.config)}, asked by {seg.who}) changed the job "
                              "during the tune")

    def _restore(self) -> str:
        """After a tune that stopped while the job runs on one of its trial sizes: the size it started from, set
        again (the rest of the configuration in force stays); what happened, as the end of the note's reason. A
        bucket size someone else set since, another strategy, or a run that ended is left as it is."""
        base, self._base = self._base, None  # no longer checking: the switch back is the tuner's own
        pending, self._pending = self._pending, None
        if base is None or (not self._last_mb and pending is None) or self._halt.is_set() \
                or self.state.snapshot().finished:
            return ""
        start_mb = self._start_trial.bucket_mb
        try:
            if pending is not None:  # the tuner's own set, still queued at rank 0, lands first: then decide
                segment = self._applied(*pending)
                self._last_mb = pending[1]
                self._wait(lambda s: s.segment >= segment or None, TRIAL_WAIT_S, f"segment {segment} did not start")
            config = self.state.snapshot().config
            if config.get("strategy") != "ddp" or float(config.get("bucket_mb", 0)) != self._last_mb \
                    or self._last_mb == start_mb:
                return ""
            self._switch(start_mb)
        except Exception as exc:  # the run ended, or the switch back was refused: the note says which
            return f"; could not go back to {start_mb:g} MB ({exc})"
        return f"; back on {start_mb:g} MB"

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
