"""`ddptop lab exec | list | clean`: reach a running lab's hosts from this machine, see labs, remove dead ones.

The lab's bridge lives in a namespace of its own (so two labs, both on 192.0.2.0/24, never meet), which means
this machine's own shell cannot reach 192.0.2.1; `ddptop lab exec` runs a command on one of the lab's hosts
instead, with the lab's job files, so `ddptop lab exec ddptop ctl status` and `ddptop lab exec ddptop attach`
find the job as they would on the cluster's node 0.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Sequence

from ddptop.cli.parser import Parser
from ddptop.errors import LabUnavailable, UsageError
from ddptop.lab import netns, state


COMMANDS = {
    "exec": "run a command on a running lab's host: ddptop lab exec ddptop ctl status",
    "list": "the labs running on this machine",
    "clean": "remove labs whose ddptop lab process is gone (namespaces, links, cgroups)",
}


def running() -> list[state.LabRecord]:
    return [r for r in state.records() if r.owner_alive()]


def cmd_exec(argv: Sequence[str]) -> int:
    p = Parser(prog="ddptop lab exec", description="Run a command on a host of a running lab.")
    p.add_argument("--lab", metavar="TAG", help="which lab (ddptop lab list); needed when several run")
    p.add_argument("--node", type=int, default=0, help="which host (0)")
    p.add_argument("command", nargs=argparse.REMAINDER, help="the command; `ddptop ...` runs this ddptop")
    args = p.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        raise UsageError("ddptop lab exec needs a command, e.g. ddptop lab exec ddptop ctl status")
    record = _pick(args.lab)
    ns = f"{state.PREFIX}-{record.tag}-n{args.node}"
    if not 0 <= args.node < record.nodes or not netns.namespace_exists(ns):
        raise UsageError(f"lab {record.tag} has nodes 0..{record.nodes - 1}, not {args.node}")
    if command[0] == "ddptop":
        command = [sys.executable, "-m", "ddptop", *command[1:]]
    env = {**os.environ, "DDPTOP_STATE_DIR": os.path.join(record.folder, "jobs")}
    try:
        os.execvpe("ip", netns.exec_argv(ns, command), env)
    except OSError as exc:
        raise LabUnavailable(f"cannot run ip netns exec: {exc.strerror or exc}") from None


def _pick(tag: str | None) -> state.LabRecord:
    labs = running()
    if tag is not None:
        labs = [r for r in labs if r.tag == tag]
        if not labs:
            raise UsageError(f"no running lab {tag} (ddptop lab list shows them)")
    if not labs:
        raise UsageError("no lab is running on this machine (start one with ddptop lab)")
    if len(labs) > 1:
        raise UsageError(f"several labs run ({', '.join(r.tag for r in labs)}): pick one with --lab TAG")
    return labs[0]


def cmd_list(argv: Sequence[str]) -> int:
    Parser(prog="ddptop lab list", description="Labs running on this machine.").parse_args(argv)
    labs = running()
    if not labs:
        print("no lab is running on this machine")
    for r in labs:
        started = time.strftime("%H:%M:%S", time.localtime(r.created))
        print(f"{r.tag}  {r.nodes} nodes  link {r.link}  cpus {r.cpus}  pid {r.owner_pid}  since {started}")
    return 0


def cmd_clean(argv: Sequence[str]) -> int:
    Parser(prog="ddptop lab clean", description="Remove labs whose ddptop lab process is gone.").parse_args(argv)
    if os.geteuid() != 0:
        raise LabUnavailable("ddptop lab clean needs root")
    removed = state.remove_dead_labs()
    print(f"removed {len(removed)} dead lab{'s' if len(removed) != 1 else ''}{': ' if removed else ''}"
          f"{', '.join(removed)}")
    return 0
