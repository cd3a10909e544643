"""Provides `notice`: what an event says to the user, in one wording for the screen's notices and the printed lines."""

from __future__ import annotations

from ddptop.events import (ConfigApplied, ControlRefused, Event, EventsRefused, LogLine, ModelsDiverged, OutOfMemory, RankBack,
                           RankLost, RankShifted, RecorderFailed, RunState, StoreFlooded, TelemetryGap,
                           TuneNote)
from ddptop.metrics.tables import describe

MB = 1e6


def _span(first: int, last: int) -> str:
    return str(first) if first == last else f"{first}-{last}"


def notice(event: Event, steps_done: int | None = None) -> str | None:
    """The line for an event worth a notice, else None. `steps_done`: for RankLost, the steps the front saw the rank
    finish (1-based, as the progress lines count: the last StepDone's step + 1), when it knows better than the event."""
    if isinstance(event, ConfigApplied):
        if event.rank != 0 or event.who == "start":
            return None
        synced = f"; one-off: {event.sync_bytes / MB:.1f} MB broadcast from rank 0" if event.sync_bytes else ""
        return (f"step {event.step}: now {describe(event.config)} (segment {event.segment}, asked by {event.who}; "
                f"switch took {event.switch_s:.2f} s{synced})")
    if isinstance(event, RankLost):
        step = steps_done if steps_done is not None else max(0, event.last_step)  # a heartbeat's step counts steps done
        return f"rank {event.rank} lost after step {step}: {event.reason}"
    if isinstance(event, RankBack):
        return f"rank {event.rank} is back at step {event.step} after {event.silent_s:g} s of silence"
    if isinstance(event, TelemetryGap):
        return (f"rank {event.rank}: telemetry batch{'es' if event.last_seq > event.first_seq else ''} "
                f"{_span(event.first_seq, event.last_seq)} lost ({event.reason}); the steps in them are missing here "
                "and in the recording")
    if isinstance(event, RecorderFailed):
        then = "stopping the job (--record-required)" if event.required else "training goes on"
        return f"recording to {event.path} stopped: {event.reason}; it keeps everything before; {then}"
    if isinstance(event, RunState):
        return f"step {event.step}: {'paused' if event.paused else 'resumed'}" if event.rank == 0 else None
    return _other(event)


def _other(event: Event) -> str | None:
    if isinstance(event, OutOfMemory):
        return f"step {event.step}: {event.describe()}"
    if isinstance(event, ModelsDiverged):
        return f"WARNING: {event.describe()}"
    if isinstance(event, ControlRefused):
        return f"control request {event.request_id} refused: {event.reason}"
    if isinstance(event, StoreFlooded):
        return (f"the store holds {event.keys} keys, more than this job ever writes ({event.expected}): someone else "
                "on its port is filling it (docs/explanation/trust-model.md)")
    if isinstance(event, EventsRefused):
        return (f"rank {event.rank}: refused {event.count} event{'s' if event.count != 1 else ''} of batch {event.seq} "
                f"that did not check out ({event.reason})")
    if isinstance(event, (TuneNote, RankShifted)):
        return event.describe()
    if isinstance(event, LogLine):
        return f"{event.who} {event.level}: {event.message}"
    return None
