"""Records the fixed event stream the TUI tests replay: a real 2-rank tiny job with two live switches.

Run once (`.venv/bin/python tests/tui/make_fixture.py`); the output, tests/tui/data/session.json.gz (gzip: 0.17 MB,
not 0.76), is committed so the Pilot and snapshot tests see the same events every time.
"""

from __future__ import annotations

import gzip
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from ddptop.config import RunConfig, SyncConfig  # noqa: E402
from ddptop.control.client import ControlClient  # noqa: E402
from ddptop.events import StepDone  # noqa: E402
from jobs import run_job  # noqa: E402
import ports  # noqa: E402

TOKEN = "fixture-token"
STEPS = 400
SWITCHES = [(100, {"strategy": "ddp", "bucket_mb": 0.02}), (200, {"strategy": "gather-scatter"}),
            (300, {"strategy": "allreduce", "async_op": True})]
OUT = os.path.join(os.path.dirname(__file__), "data", "session.json.gz")


def _wait_for_step(collected, step: int) -> None:
    while not any(isinstance(e, StepDone) and e.rank == 0 and e.step >= step for e in list(collected)):
        time.sleep(0.05)


def main() -> None:
    port = ports.port()

    def script(collected):
        while True:
            try:
                client = ControlClient("127.0.0.1", port, TOKEN, role="tui")
                client.status()
                break
            except Exception:
                time.sleep(0.2)
        for step, changes in SWITCHES:
            _wait_for_step(collected, step)
            client.send("set", changes, timeout_s=60)

    cfg = RunConfig(model="tiny", sync=SyncConfig(strategy="allreduce", batch_size=16, lr=0.05), steps=STEPS,
                    synthetic_size=1280, span_every=10, eval=True, backend="gloo")
    code, events = run_job(cfg, world_size=2, port=port, token=TOKEN, script=script, timeout_s=60)
    if code != 0:
        raise SystemExit(f"fixture job failed with exit code {code}")
    text = json.dumps([e.to_dict() for e in events], separators=(",", ":")).encode()
    with open(OUT, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as fh:  # same bytes
        fh.write(text)
    print(f"{len(events)} events -> {OUT} ({os.path.getsize(OUT)} bytes)")


if __name__ == "__main__":
    main()
