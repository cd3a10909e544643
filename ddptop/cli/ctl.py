"""`ddptop ctl`: change a running job from a shell; what `ddptop ctl status` prints: the job's step and config, and each
rank's recent figures, from the newest steps the front received (hub.py keeps each rank's last ten), by ddptop.metrics."""

from __future__ import annotations

import argparse
import json
from typing import Any, Sequence

from ddptop import metrics
from ddptop.cli.parser import Parser, add_job_flags, check_port
from ddptop.events import StepDone
from ddptop.errors import UsageError
from ddptop.safe import clean_lines

WINDOW = 10  # steps per rank, the newest (the front keeps as many: keys.MAX_RECENT)


def format_status(status: dict[str, Any], where: str, steps: dict[int, list[StepDone]]) -> str:
    """One line for the job (state, one step number, the config in force), one per rank with its figures."""
    from ddptop.metrics import tables

    state = "paused" if status.get("paused") else "running"
    lines = [f"job {where} · {state} · step {status['step']} · segment {status['segment']}: "
             f"{tables.describe(status['config'])}"]
    lines.append(f"  rank  s/step  comm  exposed  ddptop   (means of each rank's newest steps, at most {WINDOW})")
    for rank in status.get("ranks", []):
        r = rank["rank"]
        f = metrics.window(steps.get(r, []))
        if f.steps:
            lines.append(f"  {r:>4}  {f.step_s:6.3f}  {f.share(f.comm_s):4.0%}  {f.exposed_comm_s * 1e3:5.1f} ms  "
                         f"{f.share(f.own_s):5.1%}"
                         + (f" +{f.threads_s * 1e3:.2f} ms CPU" if f.threads_s > 0 else ""))  # its other threads
        else:
            lines.append(f"  {r:>4}  (no recent step received)")
        if "refused" in rank:
            lines[-1] += f"  (heartbeat refused: {rank['refused']})"
    return clean_lines("\n".join(lines))  # the status was checked by the client; printed text is cleaned all the same


CTL_OPS = {"status": "the job's step, config in force and each rank's recent step time and comm",
           "set": "change the configuration: KEY=VALUE … (strategy, bucket_mb, async_op, batch_size, lr, scale_lr, "
                  "accum, compress, lr_warmup_steps, shard_unit)",
           "pause": "pause every rank at the next step boundary", "resume": "resume a paused job",
           "stop": "stop every rank at the next step boundary",
           "tune": "tune bucket: try the what-if model's best DDP bucket sizes (ddp, zero1) as short segments, keep "
                   "the fastest; tune strategy: try ddp, zero1, zero2 and zero3 likewise, with each one's memory per "
                   "rank"}


def ctl_parser() -> argparse.ArgumentParser:
    p = Parser(prog="ddptop ctl", description="Control a running ddptop job from a shell.",
                epilog="operations:\n" + "\n".join(f"  {op:<8} {what}" for op, what in CTL_OPS.items()) +
                "\n\nexit codes: 0 done, 1 refused by the job (wrong token, rank 0 said no, a tune refused or stopped, "
                "not applied in time or before the job ended), 2 bad input, 4 no job there, 5 a rank lost (or the job "
                "gone) while a request waited",
                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_job_flags(p)
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--timeout", type=float, default=None,
                   help="seconds to wait for a change to be applied (30; a tune's outcome: 600)")
    p.add_argument("op", nargs="?", metavar="OP", help="status, set, pause, resume, stop or tune")
    p.add_argument("assignments", nargs="*", metavar="KEY=VALUE",
                   help="for set: strategy, bucket_mb, async_op, batch_size, lr, scale_lr, accum, "
                   "compress, lr_warmup_steps, shard_unit")
    return p


def cmd_ctl(argv: Sequence[str]) -> int:
    args = ctl_parser().parse_args(argv)
    if args.op not in CTL_OPS:
        said = f"unknown operation {args.op!r}" if args.op else "say what to do"
        raise UsageError(f"ctl: {said}: status, set KEY=VALUE …, pause, resume, stop or tune bucket|strategy "
                         "(see ddptop ctl --help)")
    from ddptop.control.client import ControlClient
    from ddptop.control.commands import parse_assignments

    if args.op == "tune" and args.assignments not in (["bucket"], ["strategy"]):
        raise UsageError("ctl tune: say what to tune: ddptop ctl tune bucket, or ddptop ctl tune strategy")
    if args.op not in ("set", "tune") and args.assignments:
        raise UsageError(f"{args.op} takes no KEY=VALUE arguments")
    if args.timeout is None:
        args.timeout = 600.0 if args.op == "tune" else 30.0
    changes = parse_assignments(args.assignments) if args.op == "set" else None
    check_port(args.port)
    if not 0 < args.timeout <= 86400:
        raise UsageError(f"--timeout must be a number of seconds in (0, 86400], got {args.timeout:g}")
    client = ControlClient.find(args.master, args.port, args.token, prefix=args.prefix)
    if args.op == "status":
        status = client.status(steps=not args.json)
        if args.json:
            print(json.dumps(status, indent=2))
        else:
            steps = client.steps
            print(format_status(status, f"{client.master}:{client.port}", steps))
        return 0
    if args.op == "tune":
        answer = client.tune(args.timeout, args.assignments[0])
        print(json.dumps(answer) if args.json else clean_lines(str(answer.get("line", ""))))
        return 0
    answer = client.send(args.op, changes, timeout_s=args.timeout)
    if args.json:
        print(json.dumps(answer))
    elif answer.get("state") == "unchanged":  # pause, resume: rank 0 was already so (idempotent)
        print(f"{args.op}: the job is already {'paused' if args.op == 'pause' else 'running'} (rank 0 at step "
              f"{answer.get('step', '?')}); nothing changed")
    elif args.op == "set":
        print(f"applied at step {answer.get('step', '?')} (segment {answer.get('segment', '?')}) on every rank")
    else:
        print(f"{args.op}: accepted by rank 0; every rank {'stops' if args.op == 'stop' else args.op + 's'} "
              "at the next step boundary")
    return 0
