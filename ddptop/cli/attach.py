"""`ddptop attach`: watch a running job from another terminal or machine; leaving never stops it."""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

from ddptop.cli.parser import Parser, add_job_flags, add_metrics_flags, add_screen_flags, check_port, metrics_flags, \
    screen_flags
from ddptop.errors import UsageError


def parser() -> argparse.ArgumentParser:
    p = Parser(prog="ddptop attach", description="Watch a running ddptop job; Ctrl-C (or q) detaches.")
    add_job_flags(p)
    p.add_argument("--headless", action="store_true", help="progress lines instead of the screen")
    p.add_argument("--log-every", type=int, default=10, metavar="N")
    add_metrics_flags(p)
    add_screen_flags(p)
    return p


def cmd_attach(argv: Sequence[str]) -> int:
    args = parser().parse_args(argv)
    if args.log_every < 1:
        raise UsageError("--log-every must be at least 1")
    check_port(args.port)
    metrics = metrics_flags(args.metrics_port, args.metrics_addr)
    screen_flags(args.theme)
    from ddptop.control.client import ControlClient
    from ddptop.front.attach import watch

    client = ControlClient.find(args.master, args.port, args.token, role="attach", prefix=args.prefix)
    headless = args.headless or not (sys.stdin.isatty() and sys.stdout.isatty())
    try:
        watch(client, headless, args.log_every, metrics)
    except KeyboardInterrupt:
        print("ddptop: detached; the job goes on", file=sys.stderr)
    return 0
