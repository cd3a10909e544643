"""Provides what every command's parser shares: one-line usage errors, the job flags, checked ports and booleans."""

from __future__ import annotations

import argparse
import os

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


def add_screen_flags(p: argparse.ArgumentParser) -> None:
    """--theme (run, replay and attach say it alike)."""
    from ddptop.tui.prefs import THEMES  # no textual: the preferences module reads and writes one file

    p.add_argument("--theme", choices=THEMES, help="the screen's colours for this session (default: the last one "
                   "chosen with t on the screen, else dark)")


def screen_flags(theme: str | None) -> None:
    """The screen reads --theme where it reads its saved preferences (tui.prefs.load), through the environment."""
    if theme:
        from ddptop.tui.prefs import THEME_ENV

        os.environ[THEME_ENV] = theme


METRICS_ADDR = "0.0.0.0"  # every interface, as node_exporter listens: Prometheus scrapes from another machine


def add_metrics_flags(p: argparse.ArgumentParser) -> None:
    """--metrics-port and --metrics-addr (run and attach say them alike)."""
    p.add_argument("--metrics-port", type=int, metavar="PORT",
                   help="serve the job's figures to Prometheus at http://HOST:PORT/metrics "
                        "(docs/how-to/prometheus.md)")
    p.add_argument("--metrics-addr", metavar="ADDR", help=f"the address --metrics-port listens on ({METRICS_ADDR}: "
                   "every interface, so Prometheus on another machine can scrape it; 127.0.0.1: this machine only)")


def metrics_flags(port: int | None, addr: str | None) -> tuple[int, str] | None:
    """(port, address) of the Prometheus endpoint, checked; None without --metrics-port."""
    if port is None:
        if addr is not None:
            raise UsageError("--metrics-addr says where --metrics-port listens: give --metrics-port too")
        return None
    check_port(port, "--metrics-port")
    if addr is not None and not addr.strip():
        raise UsageError("--metrics-addr is empty: an address of this machine, e.g. 0.0.0.0 or 127.0.0.1")
    return port, addr or METRICS_ADDR
