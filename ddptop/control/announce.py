"""Provides the job's word on where it records: what `ddptop attach` reads from the front (host:path, or none)."""

from __future__ import annotations

import os
import socket


def announce(hub, path: str | None) -> None:
    """Tell `ddptop attach` where this job is recorded (or that it is not): kept by the front's hub (hub.py)."""
    hub.say(recording={"path": os.path.abspath(path) if path else "", "host": socket.gethostname()})


def announced(client) -> str | None:
    """`host:path` of the job's recording, `` when it records nothing, None when the job did not say (or the front
    could not be asked)."""
    try:
        return client.recording()
    except Exception:  # a front gone meanwhile: attach then says it does not know
        return None
