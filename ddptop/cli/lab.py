"""`ddptop lab`: build a cluster of N hosts on this machine, run the job on it, remove everything it made.

    ddptop lab --nodes 4 --link 1gbit [--cpus-per-node C] [run flags...]   a job on 4 emulated hosts
    ddptop lab --profile cs744-lab --record-dir runs/                     a profile's lab, runs and report
    ddptop lab --nodes 3 --link 100mbit --check                           measure the links and quotas
    ddptop lab exec [--lab TAG] [--node I] CMD...                         a command on a running lab's host
    ddptop lab list | clean                                               running labs | remove dead ones
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass
from typing import Sequence

from ddptop.cli import lab_tools
from ddptop.cli.parser import Parser
from ddptop.cli.run import config_from_args, parse_run_args
from ddptop.errors import UsageError
from ddptop.lab.capacity import check_fits
from ddptop.lab.cluster import DEFAULT_SUBNET, Lab, machine_cores
from ddptop.lab.links import parse_link
from ddptop.lab.profile import LabSettings, Run, lab_settings
from ddptop.safe import replacing

OWN_FLAGS = ("local", "master", "rank", "world_size", "iface")  # the lab sets where every rank runs


def lab_parser() -> Parser:
    p = Parser(prog="ddptop lab", allow_abbrev=False,
               usage="ddptop lab [lab flags] [run flags]  |  ddptop lab exec | list | clean ... (see below)",
               description="Run a ddptop job on N emulated hosts (network namespaces, shaped links, CPU quotas) "
                           "on this machine;\nevery other flag is a run flag (see ddptop --help).",
               epilog=_epilog(), formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", type=int, metavar="N", help="hosts, one rank each (default: the profile's, else 2)")
    p.add_argument("--link", metavar="RATE", help="each host's link, both ways: 100mbit, 1gbit, 2.5gbit, 10gbit, "
                                                  "unlimited (default: the profile's, else 1gbit)")
    p.add_argument("--cpus-per-node", metavar="C", help="CPU quota per host in cores, or unlimited "
                                                        "(default: the profile's, else cores / nodes)")
    p.add_argument("--subnet", default=DEFAULT_SUBNET, help=f"the hosts' addresses ({DEFAULT_SUBNET})")
    p.add_argument("--record-dir", metavar="DIR", help="record every run to DIR/PROFILE[-RUN].db and write "
                                                       "DIR/report/ from them")
    p.add_argument("--check", action="store_true", help="measure the links and CPU quotas, then leave")
    return p


def _epilog() -> str:
    return "\n".join(["commands (ddptop lab COMMAND --help for each):",
                      *(f"  {name:<6} {what}" for name, what in lab_tools.COMMANDS.items())])


@dataclass(frozen=True)
class Plan:
    lab: Lab
    runs: tuple[Run, ...]
    records: tuple[str | None, ...]
    report: str | None
    warmup: int  # steps of each segment left out of the lab's tables (the sweep's warm-up, else 1)


def cmd_lab(argv: Sequence[str]) -> int:
    argv = list(argv)
    if argv and argv[0] in lab_tools.COMMANDS:
        return getattr(lab_tools, f"cmd_{argv[0]}")(argv[1:])
    args, run_argv = lab_parser().parse_known_args(argv)
    plan = make_plan(args, run_argv)
    from ddptop.lab.launch import Signals

    signals, lab, code = Signals(), plan.lab, 0
    try:
        lab.build()  # a lab that fails to build removes what it made before it raises
    except BaseException:
        with signals.shield():
            lab.teardown()
        signals.restore()
        raise
    try:
        print(f"ddptop lab {lab.tag}: {lab.describe()}", file=sys.stderr)
        code = run_plan(plan, run_argv, signals, args.check)
    except KeyboardInterrupt:  # SIGINT/SIGTERM/SIGHUP to the lab process outside a job
        code = 130
    finally:
        with signals.shield():
            left = lab.teardown()
        signals.restore()
        if left:
            print(f"ddptop lab: could not remove {', '.join(left)}; the next ddptop lab removes it", file=sys.stderr)
            code = code or 1
        else:
            print(f"ddptop lab {lab.tag}: removed", file=sys.stderr)
    if code == 0 and plan.report and signals.skipped:  # a report missing the runs a stop left out would mislead
        made = [r for r in plan.records if r and os.path.exists(r)]
        print("ddptop lab: stopped, so no report" + (f"; to make one: ddptop report {' '.join(made)} -o DIR"
                                                      if made else ""), file=sys.stderr)
    elif code == 0 and plan.report:
        return write_report(plan)
    return code


def run_plan(plan: Plan, run_argv: list[str], signals, check: bool) -> int:
    """Every run of the plan on the built lab (or its measurements with --check); the first failing exit code."""
    from ddptop.lab.launch import run_job, stopped_by_user

    if check:
        from ddptop.lab.check import report

        print("\n".join(report(plan.lab)))
        return 0
    print("ddptop lab: from another terminal: ddptop lab exec ddptop ctl status | ddptop lab exec ddptop attach",
          file=sys.stderr)
    for i, (run, record) in enumerate(zip(plan.runs, plan.records)):
        if len(plan.runs) > 1:
            print(f"ddptop lab: run {run.name} on {run.nodes} node{'s' if run.nodes > 1 else ''}", file=sys.stderr)
        code = run_job(plan.lab, run.nodes, [*run.argv(), *run_argv, *run.flags], record, signals)
        signals.stopped = signals.stopped or bool(signals.pending) or stopped_by_user(plan.lab)
        if code or signals.stopped:
            left = signals.skipped = [r.name for r in plan.runs[i + 1:]]
            if left and not code:
                print(f"ddptop lab: stopped; not started: run{'s' if len(left) > 1 else ''} {', '.join(left)}",
                      file=sys.stderr)
            return code
    return 0


def write_report(plan: Plan) -> int:
    """`ddptop report` over every run, then the lab's own tables (link utilization, NIC bytes per host)."""
    from ddptop.lab import summary
    from ddptop.record.reader import Recording
    from ddptop.cli.report import cmd_report

    code = cmd_report([*plan.records, "-o", plan.report])
    rows = []
    for run, path in zip(plan.runs, plan.records):
        with Recording.open(path) as rec:
            rows += summary.segments(list(rec.events()), run.name, plan.warmup)
    path = os.path.join(plan.report, "lab.md")
    with replacing(path) as f:
        f.write(summary.markdown(summary.by_config(rows), plan.lab.link, f"`ddptop lab` {plan.lab.describe()}; "
                                                      f"{plan.warmup} warm-up step(s) left out per segment."))
    print(f"wrote {path}", file=sys.stderr)
    return code


def make_plan(args, run_argv: list[str]) -> Plan:
    """Check everything before anything is built: flags, profile, recordings that must not exist yet."""
    run_args, profile = _placed(run_argv)
    settings = lab_settings(run_args.profile)
    runs = _runs(args, settings)
    nodes = max(r.nodes for r in runs)
    link = parse_link(args.link or settings.link or "1gbit")
    cpus = _cpus(args.cpus_per_node or settings.cpus_per_node, nodes)
    for run in runs:  # the run configuration's own checks (batch size, strategy, each run's model, ...)
        cfg = _run_config(run, run_argv)
        check_fits(run.nodes, cpus, cfg.model, machine_cores())
    lab = Lab(nodes, link, cpus, args.subnet)
    records, report = _records(args, run_args, runs, profile["name"] if profile else "lab")
    warmup = profile["warmup"] if profile and profile["sweep"] else 1
    return Plan(lab, runs, records, report, warmup)


def _run_config(run: Run, run_argv: list[str]):
    """The configuration one run of the plan starts with: its own model and dataset before the typed flags."""
    try:
        run_args, profile = _placed([*run.argv(), *run_argv, *run.flags])
        return config_from_args(run_args, profile)
    except UsageError as exc:
        if not run.argv() and not run.flags:
            raise
        raise UsageError(f"run {run.name}: {exc}") from None


def _placed(run_argv: list[str]):
    """parse_run_args, refusing the flags that say where ranks run (the lab places them)."""
    run_args, profile = parse_run_args(run_argv)
    given = [f"--{name.replace('_', '-')}" for name in OWN_FLAGS if getattr(run_args, name) is not None]
    if given:
        raise UsageError(f"ddptop lab places the ranks itself: drop {', '.join(given)}")
    return run_args, profile


def _runs(args, settings: LabSettings) -> tuple[Run, ...]:
    if args.nodes is not None:  # typed: one run on that many hosts, whatever the profile lists
        if args.nodes < 1:
            raise UsageError(f"--nodes must be at least 1, got {args.nodes}")
        return (Run("", args.nodes),)
    if settings.runs:
        return settings.runs
    return (Run("", settings.nodes or 2),)


def _cpus(text: str | None, nodes: int) -> float | None:
    """Cores per host: typed or the profile's, else this machine's cores shared equally by the hosts."""
    if text is None:
        return machine_cores() / nodes
    if text.strip().lower() in ("unlimited", "none"):
        return None
    try:
        value = float(text)
    except ValueError:
        raise UsageError(f"--cpus-per-node: expected cores like 0.5 or 2, or unlimited, got {text!r}") from None
    if not 0.01 <= value <= machine_cores():
        raise UsageError(f"--cpus-per-node must be between 0.01 and this machine's {machine_cores()} cores, "
                         f"got {value:g}")
    return value


def _records(args, run_args, runs: tuple[Run, ...], stem: str) -> tuple[tuple[str | None, ...], str | None]:
    if args.record_dir and run_args.record:
        raise UsageError("give --record FILE or --record-dir DIR, not both")
    if run_args.record:
        if len(runs) > 1:
            raise UsageError(f"this profile makes {len(runs)} runs: record them with --record-dir DIR")
        return (None,), None  # the run flags carry --record to node 0's front
    if not args.record_dir:
        return (None,) * len(runs), None
    paths = tuple(os.path.join(args.record_dir, f"{stem}-{r.name}.db" if r.name else f"{stem}.db") for r in runs)
    for path in paths:
        if os.path.lexists(path):
            raise UsageError(f"{path} exists: ddptop never overwrites a recording")
    try:
        os.makedirs(args.record_dir, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"cannot create {args.record_dir}: {exc.strerror or exc}") from None
    return paths, os.path.join(args.record_dir, "report")
