"""Rank 0's front process for the namespace tests: runs `ddptop`'s real front and dumps every event as JSON lines.

    python tests/netns_front.py OUT.jsonl -- <ddptop run flags with --master/--rank 0/--world-size>
"""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")  # as `ddptop` itself does, before torch loads

from ddptop.cli import config_from_args, parse_run_args
from ddptop.headless import HeadlessConsumer, HeadlessPrinter
from ddptop.train import rendezvous
from ddptop.train.launch import run_front
from ddptop.train.worker import WorkerOptions


class JsonLines:
    def __init__(self, path: str):
        self.file = open(path, "w")

    def handle(self, events) -> None:
        for event in events:
            self.file.write(json.dumps(event.to_dict()) + "\n")
        self.file.flush()


def main() -> int:
    out, argv = sys.argv[1], sys.argv[3:]
    args, profile = parse_run_args(argv)
    cfg = config_from_args(args, profile)
    rdv = rendezvous.resolve(args.master, args.port, args.rank, args.world_size, None)
    printer = HeadlessPrinter(every=args.log_every)
    return run_front(cfg, rdv, WorkerOptions(timeout_s=args.timeout), HeadlessConsumer(printer, [JsonLines(out)]))


if __name__ == "__main__":
    raise SystemExit(main())
