"""Provides the job's word on where it records: a sealed key `ddptop attach` reads (host:path, or none)."""

from __future__ import annotations

import os
import socket

from ddptop.control import keys
from ddptop.safe import clean


def announce(store, job, path: str | None) -> None:
    """Tell `ddptop attach` where this job is recorded (or that it is not): a sealed key on the job's channel."""
    from ddptop.control.commands import seal_json

    store.set(keys.RECORDING, seal_json(job.control, keys.CTX_RECORDING,
                                        {"path": os.path.abspath(path) if path else "", "host": socket.gethostname()}))


def announced(store, key: bytes) -> str | None:
    """`host:path` of the job's recording, `` when it records nothing, None when the job did not say (or what the
    store holds is not the job's)."""
    from ddptop.control.auth import BadValue
    from ddptop.control.commands import open_json

    try:
        if not store.check([keys.RECORDING]):
            return None
        data = open_json(key, keys.CTX_RECORDING, store.get(keys.RECORDING), keys.MAX_SMALL_BYTES)
        path, host = clean(str(data.get("path", "")), 300), clean(str(data.get("host", "")), 100)
    except (BadValue, ValueError, AttributeError, OSError, RuntimeError):
        return None
    return f"{host}:{path}" if path else ""
