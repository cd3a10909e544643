"""Provides what every command's parser shares: one-line usage errors, the job flags, checked ports and booleans."""

from __future__ import annotations

import argparse

from ddptop.errors import UsageError


class Parser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse would print usage + message and exit 2: we want one line
        raise UsageError(f"{message} (see {self.prog} --help)")


def parse_bool(text: str) -> bool:
    value = text.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def check_port(port: int | None, flag: str = "--port") -> None:
    if port is not None and not 1 <= port <= 65535:
        raise UsageError(f"{flag} must be between 1 and 65535, got {port}")


def add_job_flags(p: argparse.ArgumentParser) -> None:
    """How `ctl` and `attach` find a running job (defaults: the job file on this machine)."""
    p.add_argument("--master", help="the job's master address (default: the job running on this machine)")
    p.add_argument("--port", type=int, help="the job's store port (default: from this machine's job file)")
    p.add_argument("--token", help="the job token (default: DDPTOP_TOKEN, then this machine's job file)")
    p.add_argument("--prefix", help="key prefix of a job under torchrun's agent store (/attempt_N)")
