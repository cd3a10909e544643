"""Command line: `ddptop [run flags]` and its subcommands; every DdptopError becomes one line and an exit code, here
and nowhere else (each command's parser and handler lives in a module of this package)."""

from __future__ import annotations

import os
import sys
from typing import Sequence

from ddptop.errors import DdptopError, UsageError


COMMANDS = {
    "run": "train and watch a job (the default: `ddptop [flags]` is `ddptop run [flags]`)",
    "ctl": "change a running job from a shell: status, set KEY=VALUE, pause, resume, stop",
    "attach": "watch a running job from another terminal or machine; leaving never stops it",
    "info": "what a recording holds: run, hosts, duration, the per-segment table",
    "replay": "play a recording on the screen (or --headless as the run's lines)",
    "export": "a recording as a Chrome trace (Perfetto) or CSV tables",
    "report": "a markdown report with figures from one or several recordings",
    "lab": "a job on N emulated hosts on this machine (namespaces, shaped links); lab exec | list | clean",
    "advise": "predict every strategy, bucket size, world size and link from one segment of a recording",
}


def _lazy(module: str, name: str):
    """Subcommands import their modules only when used, so `ddptop info` never loads torch or textual."""
    def load():
        import importlib

        return getattr(importlib.import_module(module), name)

    return load


SUBCOMMANDS = {
    "ctl": _lazy("ddptop.cli.ctl", "cmd_ctl"),
    "info": _lazy("ddptop.cli.recordings", "cmd_info"),
    "export": _lazy("ddptop.cli.recordings", "cmd_export"),
    "replay": _lazy("ddptop.cli.recordings", "cmd_replay"),
    "report": _lazy("ddptop.cli.report", "cmd_report"),
    "advise": _lazy("ddptop.cli.advise", "cmd_advise"),
    "attach": _lazy("ddptop.cli.attach", "cmd_attach"),
    "lab": _lazy("ddptop.cli.lab", "cmd_lab"),
}


def main(argv: Sequence[str] | None = None) -> int:
    # everything inside the try: a Ctrl-C that lands anywhere (an import, the first line: a CI run caught one in
    # os.environ.setdefault) is still "interrupted", exit 130, never a traceback
    try:
        argv = list(sys.argv[1:] if argv is None else argv)
        # c10d logs a store it cannot reach as ~25 lines of C++ frames, even at its ERROR level; ddptop says it in
        # one line. Set before torch is imported (it reads the level once).
        os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "INFO" if os.environ.get("DDPTOP_DEBUG") else "FATAL")
        if argv and argv[0] in SUBCOMMANDS:
            return SUBCOMMANDS[argv[0]]()(argv[1:])
        if argv and argv[0] == "run":
            argv = argv[1:]
        elif argv and not argv[0].startswith("-"):
            raise UsageError(f"unknown command {argv[0]!r}: ddptop [run] [flags], or one of "
                             f"{', '.join(c for c in COMMANDS if c != 'run')} (ddptop --help says what each does)")
        from ddptop.cli.run import cmd_run

        return cmd_run(argv)
    except DdptopError as exc:
        from ddptop.safe import clean

        print(f"ddptop: {clean(str(exc), 500)}", file=sys.stderr)  # one line whatever the message holds
        return exc.exit_code
    except KeyboardInterrupt:
        import signal

        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C while Python shuts down changes nothing
        print("ddptop: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # a bug, or a failure ddptop did not foresee: still one line
        if os.environ.get("DDPTOP_DEBUG"):
            raise
        from ddptop.errors import DataError, user_code_line
        from ddptop.safe import clean

        mine = user_code_line(exc)  # under torchrun a rank runs here: the user's code raised while training
        if mine:
            print(f"ddptop: {mine} (DDPTOP_DEBUG=1 shows where)", file=sys.stderr)
            return DataError.exit_code
        first = (str(exc).strip().splitlines() or [""])[0][:200]
        print(f"ddptop: internal error: {type(exc).__name__}: {clean(first)} (DDPTOP_DEBUG=1 shows where)",
              file=sys.stderr)
        return 70
