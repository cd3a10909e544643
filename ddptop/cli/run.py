"""`ddptop [run] [flags]`: the run command's parser, its checks, and the run it starts."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Sequence

from ddptop import __version__
from ddptop.cli.parser import (Parser, add_metrics_flags, add_screen_flags, check_port, metrics_flags, parse_bool,
                               screen_flags)
from ddptop.config import (BACKENDS, BUCKETED, DATASETS, DEVICES, LOSSES, MODELS, PROBE_LEVELS, SHARDED,
                           STRATEGIES, RunConfig, SyncConfig, is_spec)
from ddptop.errors import UsageError


def _profiles() -> list[tuple[str, str]]:
    """(name, first line of its comment) of ddptop's own profiles (never the current folder's: anyone's text)."""
    from ddptop.profiles import OWN_DIR

    out = {}
    for folder in (OWN_DIR,):
        for path in sorted(folder.glob("*.toml")) if folder.is_dir() else []:
            try:
                first = next((line[1:].strip() for line in path.read_text().splitlines() if line.startswith("#")), "")
            except (OSError, UnicodeDecodeError):
                first = ""
            out.setdefault(path.stem, first if len(first) <= 96 else first[:95] + "…")
    return sorted(out.items())


def _epilog() -> str:
    from ddptop.cli import COMMANDS

    lines = ["commands (ddptop COMMAND --help for each):"]
    lines += [f"  {name:<8} {what}" for name, what in COMMANDS.items()]
    lines += ["", "profiles (--profile NAME: flag defaults and a sweep of configurations, one job):"]
    lines += [f"  {name:<20} {what}" for name, what in _profiles()]
    lines += ["", "exit codes: 0 ok, 1 refused by the job, 2 bad input, 3 data set missing or your code raised, 4 master or ranks "
              "unreachable, 5 a peer lost mid-run, 6 bad recording, 70 internal error, 130 interrupted, 141 output "
              "closed (| head)"]
    return "\n".join(lines)


def run_parser() -> argparse.ArgumentParser:
    p = Parser(prog="ddptop", description="Train and profile a PyTorch data-parallel job from the terminal: "
                "`ddptop [flags]` starts a job and shows it live, recording it to ./ddptop-runs/.",
                usage="ddptop [run] [flags]  |  ddptop COMMAND ... (see below)", epilog=_epilog(),
                formatter_class=argparse.RawDescriptionHelpFormatter)
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
    where.add_argument("--lost-after", type=float, default=10.0, metavar="S",
                       help="report a rank lost after S seconds without a heartbeat (10)")
    where.add_argument("--collective-timeout", type=float, default=300.0, metavar="S",
                       help="a collective (or step-boundary exchange) that waits longer than S seconds means a peer "
                            "is gone: the job fails with exit 5 (300)")
    what = p.add_argument_group("what to train")
    what.add_argument("--model", default="vgg11", metavar="|".join(MODELS) + "|SPEC",
                      help="VGG-11 as in the course (9.23M parameters), ResNet-18, a 21k-parameter CNN, the "
                           "lecture's ResNet-50 and BERT-mini; or your own: torchvision:NAME, MODULE:CALLABLE, "
                           "path/file.py:CALLABLE (docs/how-to/own-model.md) (vgg11)")
    what.add_argument("--dataset", default=None, metavar="|".join(DATASETS) + "|SPEC",
                      help="a learnable image set generated from the seed, the real sets from --data-dir, token "
                           "sequences (bert-mini's default); or your own: MODULE:CALLABLE, path/file.py:CALLABLE "
                           "(synthetic)")
    what.add_argument("--loss", default="cross-entropy", metavar="|".join(LOSSES) + "|SPEC",
                      help="the training loss; accuracy and the test-set line only with cross-entropy "
                           "(cross-entropy)")
    what.add_argument("--collate", default="", metavar="SPEC",
                      help="your collate_fn for the loaders: MODULE:CALLABLE or path/file.py:CALLABLE; a batch that "
                           "is not an (inputs, target) pair goes to the model whole and the loss gets (output, batch) "
                           "(docs/how-to/own-model.md) (torch's default_collate)")
    what.add_argument("--tokens", default="", metavar="SPEC",
                      help="your count of a batch's tokens, for tokens/s: MODULE:CALLABLE or path/file.py:CALLABLE, "
                           "called with the batch, returning a whole number (a dict batch's attention_mask summed)")
    what.add_argument("--data-dir", help="the existing folder that holds the cifar10 / mnist files (./data); "
                                         "refused with the synthetic set, which reads no files")
    what.add_argument("--batch-size", type=int, default=64, help="per rank (64)")
    what.add_argument("--lr", type=float, default=0.1, help="SGD learning rate (0.1)")
    what.add_argument("--epochs", type=int, default=1, help="passes over the training set (1)")
    what.add_argument("--steps", type=int, default=0, help="stop after this many steps (0: run the epochs)")
    what.add_argument("--seed", type=int, default=0, help="seed of the model, the data order and the synthetic set (0)")
    what.add_argument("--synthetic-size", type=int, default=12800, help="training images of the synthetic set")
    what.add_argument("--no-eval", action="store_true", help="skip the test-set evaluation at each epoch's end")
    what.add_argument("--threads", type=int, default=0,
                      help="torch threads per rank (0: OMP_NUM_THREADS if set, else cores / local ranks)")
    what.add_argument("--workers", type=int, default=-1, metavar="N",
                      help="data loader processes per rank (default: 0 on CPU, cores per rank up to 4 on a GPU)")
    sync = p.add_argument_group("gradient synchronization")
    sync.add_argument("--strategy", choices=STRATEGIES, default="ddp",
                      help="how gradients are synchronized: none, gather+scatter at rank 0, per-parameter "
                           "all_reduce, DistributedDataParallel (ddp), or ZeRO stage 1 (ddp + "
                           "ZeroRedundancyOptimizer), 2 or 3 (FSDP2's fully_shard)")
    sync.add_argument("--bucket-mb", type=float, default=None, help="DDP bucket_cap_mb, ddp and zero1 (25)")
    sync.add_argument("--shard-unit", default="", metavar="NAME[,NAME]",
                      help="zero2/zero3: the modules fully_shard makes units of, by class or qualified name "
                           "(default: each top-level block that holds parameters, and the root)")
    sync.add_argument("--async-op", type=parse_bool, nargs="?", const=True, default=False,
                      help="allreduce: launch every collective with async_op=True")
    sync.add_argument("--accum", type=int, default=1, metavar="K",
                      help="micro-steps per step (gradient accumulation): K batches per optimizer step, synced "
                           "once (DDP: the first K-1 under no_sync) (1)")
    sync.add_argument("--compress", default="none", metavar="NAME",
                      help="gradients on the wire: none, fp16, bf16, or powersgd[:R] (DDP only, rank R, 1) (none)")
    what.add_argument("--lr-warmup-steps", type=int, default=0, metavar="N",
                      help="gradual warm-up (Goyal et al.): lr·(k+1)/N at the k-th step after lr is set (0: off)")
    look = p.add_argument_group("what to measure and show")
    look.add_argument("--headless", action="store_true", help="no screen: progress lines")
    look.add_argument("--probes", choices=PROBE_LEVELS, default="all",
                      help="all: phases, collectives and per-layer spans; system: step time, CPU, NICs; off (all)")
    look.add_argument("--span-every", type=int, default=0, metavar="N",
                      help="per-layer spans every Nth step (default: 10; ranks/16 above 160 ranks)")
    where.add_argument("--token", help="job token for control messages (default: DDPTOP_TOKEN, else generated)")
    look.add_argument("--profile", metavar="NAME|FILE.toml", help="one of ddptop's profiles (below), or a file of "
                      "your own by its path; flags you type override it")
    look.add_argument("--log-every", type=int, default=10, metavar="N", help="headless: a line every N steps (10)")
    add_screen_flags(look)
    look.add_argument("--record", metavar="FILE", help="record the run to FILE (SQLite; FILE must not exist); "
                      "default: a new file in ./ddptop-runs/ named by date, time and strategy")
    look.add_argument("--no-record", action="store_true", help="do not record the run")
    what.add_argument("--save", metavar="FILE", help="at the end, rank 0 writes the model's state_dict to FILE "
                                                    "(torch.save; FILE must not exist)")
    look.add_argument("--tune", choices=["bucket", "strategy"], default=None,
                      help="bucket: once the run started, try the what-if model's best DDP bucket sizes (ddp, zero1) "
                      "as short segments and keep the fastest; strategy: try ddp, zero1, zero2 and zero3 likewise, "
                      "each one's memory per rank beside its step (docs/how-to/whatif-and-tuning.md)")
    add_metrics_flags(look)
    look.add_argument("--record-required", action="store_true",
                      help="stop the job if the recording fails (disk full); without it training goes on")
    return p


def parse_run_args(argv: Sequence[str]) -> tuple[argparse.Namespace, dict | None]:
    """Parse run flags; with --profile, the profile's values become the defaults, so typed flags still win."""
    parser = run_parser()
    args = parser.parse_args(argv)
    if not args.profile:
        return args, None
    from ddptop.profiles import load_profile

    profile = load_profile(args.profile, {a.dest: a for a in parser._actions})
    if profile["note"]:
        print(profile["note"], file=sys.stderr)
    parser.set_defaults(**profile["run"])
    return parser.parse_args(argv), profile


def check_shard_units(cfg: RunConfig, parts=None) -> None:
    """A shard unit that names no module of the model is one line before any rank starts (the model is built here
    only then: the user's, already built for its sample batch, or the built-in one)."""
    wanted = {s.shard_unit for s in (cfg.first_sync, *cfg.sweep) if s.strategy in SHARDED and s.shard_unit}
    if not wanted:
        return
    from ddptop.train.models import build_model
    from ddptop.train.strategies.fsdp import shard_units

    model = parts.model if parts is not None else build_model(cfg.model)
    for spec in sorted(wanted):
        shard_units(model, spec)


def config_from_args(args: argparse.Namespace, profile: dict | None = None) -> RunConfig:
    bucket_given = args.bucket_mb is not None
    sync = SyncConfig(strategy=args.strategy, bucket_mb=args.bucket_mb if bucket_given else 25.0, async_op=args.async_op,
                      batch_size=args.batch_size, lr=args.lr, accum=args.accum, compress=args.compress,
                      lr_warmup_steps=args.lr_warmup_steps, shard_unit=args.shard_unit)
    sweep = tuple(sync.changed(changes) for changes in profile["sweep"]) if profile else ()
    if bucket_given and args.strategy not in BUCKETED and not any(s.strategy in BUCKETED for s in sweep):
        raise UsageError(f"--bucket-mb applies only to ddp and zero1, not to {args.strategy}")
    if args.shard_unit and args.strategy not in SHARDED and not any(s.strategy in SHARDED for s in sweep):
        raise UsageError(f"--shard-unit applies only to zero2 and zero3, not to {args.strategy}")
    sync = sweep[0] if sweep else sync  # what runs first is what every report of the start says
    dataset = args.dataset or ("tokens" if args.model == "bert-mini" else "synthetic")
    if args.data_dir is not None and dataset in ("synthetic", "tokens"):
        # refused, not warned: a run on the synthetic set that the user meant to run on their files wastes the
        # run, and a warning line is gone as soon as the screen takes the terminal
        raise UsageError(f"--data-dir is for --dataset cifar10, mnist or your own; the {dataset} set reads no files "
                         "(add --dataset cifar10|mnist, or drop --data-dir)")
    extra = {"sweep": sweep, "sweep_warmup": profile["warmup"], "sweep_measure": profile["measure"],
             "sweep_until_oom": profile["until_oom"], "profile": profile["name"]} if profile else {}
    data_dir = os.path.abspath(args.data_dir or "./data")
    return RunConfig(**extra, model=args.model, dataset=dataset, loss=args.loss, collate=args.collate, tokens=args.tokens,
                     data_dir=data_dir, sync=sync,
                     epochs=args.epochs, steps=args.steps, seed=args.seed, backend=args.backend,
                     device=args.device, workers=args.workers, probes=args.probes,
                     span_every=args.span_every, iface=args.iface, threads=args.threads,
                     synthetic_size=args.synthetic_size, eval=not args.no_eval, save=_save_path(args.save))


def _save_path(path: str | None) -> str:
    """--save FILE: checked before any rank starts (an existing file is never overwritten; the folder takes a file)."""
    from ddptop.train.save import check_target

    return check_target(path) if path else ""


def cmd_run(argv: Sequence[str]) -> int:
    omp = os.environ.get("OMP_NUM_THREADS")
    try:
        return _run(argv)
    finally:  # set for this job's ranks (_checked): a caller in this process (a test, a notebook) gets its own back
        if omp is None:
            os.environ.pop("OMP_NUM_THREADS", None)
        else:
            os.environ["OMP_NUM_THREADS"] = omp


def _run(argv: Sequence[str]) -> int:
    from ddptop.train import lifetime

    with lifetime.imports_frozen():  # torch and the ranks' modules load here, before any fork (~1.4 CPU-s a job)
        args, profile, cfg, rdv, metrics = _checked(argv)
    parts = None
    if any(is_spec(v) for v in (cfg.model, cfg.dataset, cfg.loss, cfg.collate, cfg.tokens)):
        from ddptop.train import specs

        # the user's code on one sample batch, before any rank starts: one line for what is wrong
        parts = specs.build(cfg)
        if profile:  # the code ran its check: now say whose it is, when a profile of the user's named it
            from ddptop.profiles import code_note

            note = code_note(profile["path"], profile["run"], {"model": cfg.model, "dataset": cfg.dataset,
                                                                "loss": cfg.loss, "collate": cfg.collate,
                                                                "tokens": cfg.tokens})
            if note:
                print(note, file=sys.stderr)
    check_shard_units(cfg, parts)
    from ddptop.record.paths import choose
    from ddptop.front.run import records_here, run

    record = choose(args.record, args.no_record, cfg.profile or cfg.first_sync.strategy) if records_here(rdv) \
        else args.record
    return run(cfg, rdv, timeout_s=args.timeout, log_every=args.log_every, token=args.token, record=record,
               headless=args.headless, record_required=args.record_required, lost_after_s=args.lost_after,
               fresh_name=args.record is None, collective_timeout_s=args.collective_timeout, tune=args.tune or "",
               metrics=metrics)


def _checked(argv: Sequence[str]) -> tuple:
    """The run's flags checked, torch and the ranks' modules loaded, the server its CPU ranks fork from started:
    (args, profile, cfg, rdv, metrics)."""
    args, profile = parse_run_args(argv)
    cfg = config_from_args(args, profile)
    if not 0 < args.timeout <= 86400:
        raise UsageError(f"--timeout must be a number of seconds in (0, 86400], got {args.timeout:g}")
    check_port(args.port)
    metrics = metrics_flags(args.metrics_port, args.metrics_addr)
    screen_flags(args.theme)
    if not 1 <= args.lost_after <= 3600:
        raise UsageError(f"--lost-after must be 1 to 3600 seconds, got {args.lost_after:g}")
    if not 1 <= args.collective_timeout <= 86400:
        raise UsageError(f"--collective-timeout must be 1 to 86400 seconds, got {args.collective_timeout:g}")
    if args.record_required and args.no_record:
        raise UsageError("--record-required and --no-record contradict each other")
    from ddptop.train import devices
    from ddptop import rendezvous
    from ddptop.front import forks

    # the ranks' thread count set before torch loads, so that every thread of a rank computes with it (OpenMP reads
    # it once, then): this command's own rank under torchrun or Slurm, and the ranks a front starts or forks
    early = rendezvous.resolve(args.master, args.port, args.rank, args.world_size, args.local)
    planned = forks.plan(cfg, early)  # a front's CPU ranks, forked from this command's torch
    torch_before = "torch" in sys.modules  # a caller in this process loaded it (OpenMP's count is the caller's)
    os.environ["OMP_NUM_THREADS"] = str(devices.thread_count(cfg.threads, early.local_world_size))
    gpus = devices.visible_gpus()  # the first `import torch` (tests/unit/test_forks.py fails on an earlier one)
    rdv = rendezvous.resolve(args.master, args.port, args.rank, args.world_size, args.local,
                             default_local=devices.default_local(cfg.backend, cfg.device, gpus))
    rendezvous.check_host(rdv.master, rdv.port)
    if args.local is not None and args.world_size not in (None, args.local):
        raise UsageError(f"--local {args.local} starts {args.local} ranks but --world-size says {args.world_size}")
    if args.tune:
        _check_tune(cfg, rdv, args.tune)
    if metrics and rdv.source not in ("local", "flags"):
        raise UsageError(f"--metrics-port is served by a front (--local, or --rank 0 by flags); under {rdv.source} "
                         "run `ddptop attach --metrics-port PORT` on rank 0's machine")
    placement = devices.place(cfg.backend, cfg.device, rdv.local_world_size, gpus)  # this machine's ranks
    for sync in cfg.sweep or (cfg.sync,):
        devices.check_strategy(placement.device, placement.backend, sync.strategy)
    if placement.note:
        print(f"ddptop: {placement.note}", file=sys.stderr)
    from ddptop.train.data import ensure_dataset

    ensure_dataset(cfg)
    from ddptop.front.supervisor import forked

    # planned is the count set above (one thread_count); the full rendezvous must plan the same
    if planned and not torch_before and forks.plan(cfg, rdv) == planned and forked(cfg, rdv):
        forks.start()  # before the user's code (cmd_run) and the front start any thread
    return args, profile, cfg, rdv, metrics


def _check_tune(cfg: RunConfig, rdv, what: str) -> None:
    """--tune bucket|strategy: refused before anything starts where there is nothing to tune or no front to tune
    from. Buckets are DDP's, which zero1 runs too (under a sharded optimizer); zero2 and zero3 tune by strategy."""
    strategy = cfg.sync.strategy
    if cfg.sweep:
        raise UsageError(f"--tune {what} and a profile's sweep both want the configuration: use one")
    if what == "bucket" and strategy in ("zero2", "zero3"):
        raise UsageError(f"--tune bucket tunes DDP's buckets; {strategy} has none (FSDP2 shards by unit): "
                         "--tune strategy tries ddp, zero1, zero2 and zero3")
    if what == "bucket" and strategy not in ("ddp", "zero1"):
        raise UsageError(f"--tune bucket tunes DDP's buckets, not {strategy} (add --strategy ddp)")
    if what == "strategy" and strategy == "single":
        raise UsageError("--tune strategy compares strategies that synchronize the ranks, not single "
                         "(add --strategy ddp)")
    if rdv.world_size < 2:
        raise UsageError(f"--tune {what} needs 2 ranks or more: with 1 there is nothing to communicate")
    if rdv.source == "flags" and rdv.rank != 0:
        return  # the same command on every node (README: several machines): rank 0's front tunes the whole job
    if rdv.source != "local" and rdv.source != "flags":
        raise UsageError(f"--tune {what} is given to rank 0's front (--local, or --rank 0); under torchrun or Slurm "
                         f"run `ddptop ctl tune {what}` once the job runs")
