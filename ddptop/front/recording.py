"""Provides the front's recording sink: opened before any rank starts, its failure an event, closed with a verdict."""

from __future__ import annotations

import os
import sys
import time

from ddptop.errors import RecordingError
from ddptop.events import RecorderFailed
from ddptop.safe import clean


class RecorderAlarm:
    """What happens when the recording fails mid-run: an event in the job's stream (the printer and the screen
    show it), and with --record-required a stop request, so the job ends cleanly (exit 6) instead of going on."""

    def __init__(self, path: str, required: bool):
        self.path, self.required = path, required
        self.derived = None  # the pipeline's derived events (front.pipeline.compose sets it)
        self.stop = None  # asks the ranks to stop

    def __call__(self, reason: str) -> None:  # the recorder's thread
        event = RecorderFailed(self.path, clean(reason, 200), self.required, time.time())
        if self.derived is not None:
            self.derived.add([event])
        else:
            print(f"ddptop: recording to {self.path} stopped: {event.reason}", file=sys.stderr, flush=True)
        if self.required and self.stop is not None:
            self.stop()


def open_recording(path: str | None, config: dict, where: dict, alarm: RecorderAlarm | None = None):
    """`--record FILE` (or the default file): a RecordingWriter sink, created before any rank starts so a bad path
    fails first."""
    if not path:
        return None
    from ddptop.record.sqlite import RecordingWriter, base_meta

    return RecordingWriter(path, base_meta(config, where), on_error=alarm)


def end_recording(recorder, path: str, required: bool) -> bool:
    """Close the recording (a run that never started leaves no file); say what a failed writer kept.
    True when the file exists and is worth a report."""
    if recorder is None:
        return False
    recorder.discard()
    if recorder.error:
        if required:
            raise RecordingError(f"recording {path} failed ({clean(recorder.error, 200)}); the job was stopped "
                                 "(--record-required)")
        print(f"ddptop: recording {path} is incomplete ({clean(recorder.error, 200)}): it keeps everything "
              "before that; training went on", file=sys.stderr)
    return os.path.exists(path)
