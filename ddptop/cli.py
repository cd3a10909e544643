"""Command line: `ddptop [run flags]`; every DdptopError becomes one line on stderr and an exit code."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Sequence

from ddptop import __version__
from ddptop.config import BACKENDS, DATASETS, DEVICES, MODELS, PROBE_LEVELS, STRATEGIES, RunConfig, SyncConfig
from ddptop.errors import DdptopError, UsageError


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse would print usage + message and exit 2: we want one line
        raise UsageError(f"{message} (see ddptop --help)")


def _bool(text: str) -> bool:
    value = text.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def run_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="ddptop", description="Train and profile a PyTorch data-parallel job from the terminal.")
    p.add_argument("--version", action="version", version=f"ddptop {__version__}")
    where = p.add_argument_group("where the ranks run (default: 2 local ranks)")
    where.add_argument("--local", type=int, metavar="N",
                       help="start N ranks on this machine (default: one per visible GPU, else 2)")
    where.add_argument("--master", metavar="HOST", help="address of rank 0's machine")
    where.add_argument("--rank", type=int, metavar="R", help="this machine's rank (with --master)")
    where.add_argument("--world-size", type=int, metavar="N", help="number of ranks in the job")
    where.add_argument("--port", type=int, metavar="P", help="ddptop's store port (default 29511; free port for --local)")
    where.add_argument("--backend", choices=BACKENDS, default="auto",
                       help="auto: nccl when every local rank has its own GPU, else gloo on CPU")
    where.add_argument("--device", choices=DEVICES, default="auto",
                       help="auto: CUDA under nccl, CPU under gloo; cuda with gloo: CUDA tensors over gloo")
    where.add_argument("--iface", help="network interface to watch (default: the one that routes to the master)")
    where.add_argument("--timeout", type=float, default=60.0, metavar="S",
                       help="give up on an unreachable master or missing ranks after S seconds (60)")
    what = p.add_argument_group("what to train")
    what.add_argument("--model", choices=MODELS, default="vgg11")
    what.add_argument("--dataset", choices=DATASETS, default="synthetic")
    what.add_argument("--data-dir", default="./data")
    what.add_argument("--batch-size", type=int, default=64, help="per rank (64)")
    what.add_argument("--lr", type=float, default=0.1)
    what.add_argument("--epochs", type=int, default=1)
    what.add_argument("--steps", type=int, default=0, help="stop after this many steps (0: run the epochs)")
    what.add_argument("--seed", type=int, default=0)
    what.add_argument("--synthetic-size", type=int, default=12800, help="training images of the synthetic set")
    what.add_argument("--no-eval", action="store_true", help="skip the test-set evaluation at each epoch's end")
    what.add_argument("--threads", type=int, default=0, help="torch threads per rank (0: cores / local ranks)")
    what.add_argument("--workers", type=int, default=-1, metavar="N",
                      help="data loader processes per rank (default: 0 on CPU, cores per rank up to 4 on a GPU)")
    sync = p.add_argument_group("gradient synchronization")
    sync.add_argument("--strategy", choices=STRATEGIES, default="ddp")
    sync.add_argument("--bucket-mb", type=float, default=None, help="DDP bucket_cap_mb (25)")
    sync.add_argument("--async-op", type=_bool, nargs="?", const=True, default=False,
                      help="allreduce: launch every collective with async_op=True")
    look = p.add_argument_group("what to measure and show")
    look.add_argument("--headless", action="store_true", help="no screen: progress lines")
    look.add_argument("--probes", choices=PROBE_LEVELS, default="all")
    look.add_argument("--span-every", type=int, default=10, metavar="N", help="record spans every Nth step (10)")
    where.add_argument("--token", help="job token for control messages (default: DDPTOP_TOKEN, else generated)")
    look.add_argument("--profile", metavar="NAME", help="load profiles/NAME.toml (flags you type override it)")
    look.add_argument("--log-every", type=int, default=10, metavar="N", help="headless: a line every N steps (10)")
    look.add_argument("--record", metavar="FILE", help="record the run to FILE (SQLite; FILE must not exist)")
    what.add_argument("--save", metavar="FILE", help="at the end, rank 0 writes the model's state_dict to FILE "
                                                    "(torch.save; FILE must not exist)")
    return p


def parse_run_args(argv: Sequence[str]) -> tuple[argparse.Namespace, dict | None]:
    """Parse run flags; with --profile, the profile's values become the defaults, so typed flags still win."""
    parser = run_parser()
    args = parser.parse_args(argv)
    if not args.profile:
        return args, None
    from ddptop.profiles import load_profile

    profile = load_profile(args.profile, {a.dest for a in parser._actions})
    parser.set_defaults(**profile["run"])
    return parser.parse_args(argv), profile


def config_from_args(args: argparse.Namespace, profile: dict | None = None) -> RunConfig:
    bucket_given = args.bucket_mb is not None
    sync = SyncConfig(strategy=args.strategy, bucket_mb=args.bucket_mb if bucket_given else 25.0, async_op=args.async_op,
                      batch_size=args.batch_size, lr=args.lr)
    sweep = tuple(sync.changed(changes) for changes in profile["sweep"]) if profile else ()
    if bucket_given and args.strategy != "ddp" and not any(s.strategy == "ddp" for s in sweep):
        raise UsageError(f"--bucket-mb applies only to ddp, not to {args.strategy}")
    sync = sweep[0] if sweep else sync  # what runs first is what every report of the start says
    extra = {"sweep": sweep, "sweep_warmup": profile["warmup"], "sweep_measure": profile["measure"],
             "sweep_until_oom": profile["until_oom"], "profile": profile["name"]} if profile else {}
    return RunConfig(**extra, model=args.model, dataset=args.dataset, data_dir=os.path.abspath(args.data_dir),
                     sync=sync, epochs=args.epochs, steps=args.steps, seed=args.seed, backend=args.backend,
                     device=args.device, workers=args.workers, probes=args.probes,
                     span_every=args.span_every, iface=args.iface, threads=args.threads,
                     synthetic_size=args.synthetic_size, eval=not args.no_eval, save=_save_path(args.save))


def _save_path(path: str | None) -> str:
    """--save FILE: checked before any rank starts (an existing file is never overwritten)."""
    if not path:
        return ""
    full = os.path.abspath(path)
    if os.path.lexists(full):
        raise UsageError(f"--save {path}: the file exists; remove it or save to another file")
    if not os.path.isdir(os.path.dirname(full)):
        raise UsageError(f"--save {path}: no folder {os.path.dirname(full)}")
    return full


def cmd_run(argv: Sequence[str]) -> int:
    args, profile = parse_run_args(argv)
    cfg = config_from_args(args, profile)
    if args.timeout <= 0:
        raise UsageError(f"--timeout must be positive, got {args.timeout:g}")
    from ddptop.train import devices, rendezvous
    from ddptop.train.data import ensure_dataset

    gpus = devices.visible_gpus()
    rdv = rendezvous.resolve(args.master, args.port, args.rank, args.world_size, args.local,
                             default_local=devices.default_local(cfg.backend, cfg.device, gpus))
    if args.local is not None and args.world_size not in (None, args.local):
        raise UsageError(f"--local {args.local} starts {args.local} ranks but --world-size says {args.world_size}")
    placement = devices.place(cfg.backend, cfg.device, rdv.local_world_size, gpus)  # this machine's ranks
    for sync in cfg.sweep or (cfg.sync,):
        devices.check_strategy(placement.device, placement.backend, sync.strategy)
    if placement.note:
        print(f"ddptop: {placement.note}", file=sys.stderr)
    ensure_dataset(cfg)
    from ddptop.run import run

    return run(cfg, rdv, timeout_s=args.timeout, log_every=args.log_every, token=args.token, record=args.record,
               headless=args.headless)


def add_job_flags(p: argparse.ArgumentParser) -> None:
    """How `ctl` and `attach` find a running job (defaults: the job file on this machine)."""
    p.add_argument("--master", help="the job's master address (default: the job running on this machine)")
    p.add_argument("--port", type=int, help="the job's store port (default: from this machine's job file)")
    p.add_argument("--token", help="the job token (default: DDPTOP_TOKEN, then this machine's job file)")
    p.add_argument("--prefix", help="key prefix of a job under torchrun's agent store (/attempt_N)")


def ctl_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="ddptop ctl", description="Control a running ddptop job from a shell.")
    add_job_flags(p)
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for a change to be applied (30)")
    p.add_argument("op", choices=("status", "set", "pause", "resume", "stop"))
    p.add_argument("assignments", nargs="*", metavar="KEY=VALUE",
                   help="for set: strategy, bucket_mb, async_op, batch_size, lr, scale_lr")
    return p


def cmd_ctl(argv: Sequence[str]) -> int:
    args = ctl_parser().parse_args(argv)
    from ddptop.control.client import ControlClient
    from ddptop.control.commands import parse_assignments

    if args.op != "set" and args.assignments:
        raise UsageError(f"{args.op} takes no KEY=VALUE arguments")
    changes = parse_assignments(args.assignments) if args.op == "set" else None
    client = ControlClient.find(args.master, args.port, args.token, prefix=args.prefix)
    if args.op == "status":
        status = client.status()
        print(json.dumps(status, indent=2) if args.json else format_status(status, client))
        return 0
    answer = client.send(args.op, changes, timeout_s=args.timeout)
    if args.json:
        print(json.dumps(answer))
    elif args.op == "set":
        print(f"applied at step {answer['step']} (segment {answer['segment']}) on every rank")
    else:
        print(f"{args.op}: accepted")
    return 0


def format_status(status: dict, client) -> str:
    from ddptop.config import SyncConfig

    config = SyncConfig(**status["config"])
    state = "paused" if status.get("paused") else "running"
    lines = [f"job {client.master}:{client.port}  {state}  step {status['step']}  segment {status['segment']}  "
             f"{config.describe()}  lr {config.lr:g}"]
    for rank in status["ranks"]:
        lines.append(f"  rank {rank['rank']}  step {rank.get('step', '?')}")
    return "\n".join(lines)


def _lazy(module: str, name: str):
    """Subcommands import their modules only when used, so `ddptop info` never loads torch or textual."""
    def load():
        import importlib

        return getattr(importlib.import_module(module), name)

    return load


SUBCOMMANDS = {
    "ctl": lambda: cmd_ctl,
    "info": _lazy("ddptop.record.commands", "cmd_info"),
    "export": _lazy("ddptop.record.commands", "cmd_export"),
    "replay": _lazy("ddptop.record.commands", "cmd_replay"),
    "report": _lazy("ddptop.report.commands", "cmd_report"),
    "attach": _lazy("ddptop.attach", "cmd_attach"),
}


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # c10d logs lost store connections as multi-line C++ stack traces; ddptop reports them in one line instead
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    try:
        if argv and argv[0] in SUBCOMMANDS:
            return SUBCOMMANDS[argv[0]]()(argv[1:])
        return cmd_run(argv)
    except DdptopError as exc:
        print(f"ddptop: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("ddptop: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # a bug, or a failure ddptop did not foresee: still one line
        if os.environ.get("DDPTOP_DEBUG"):
            raise
        first = (str(exc).strip().splitlines() or [""])[0][:200]
        print(f"ddptop: internal error: {type(exc).__name__}: {first} (DDPTOP_DEBUG=1 shows where)", file=sys.stderr)
        return 70
