"""A profile's `[lab]` table: the cluster it wants (nodes, link, CPUs per node) and the runs one command makes.

    [lab]
    nodes = 4                 # hosts the lab builds (the largest run)
    link = "1gbit"
    cpus_per_node = 0.5       # optional: default cores / nodes; the same for every run, so nodes stay alike
    runs = [{ name = "n1", nodes = 1 }, { name = "n2", nodes = 2 }, { name = "n4", nodes = 4 }]  # optional
    runs = [{ name = "r50", nodes = 2, model = "resnet50" }, { name = "bert", nodes = 2, model = "bert-mini" }]

Without `runs`, one job on every host. Each run is a whole job (its own recording), on hosts 0..nodes−1; a run
may name its own model and dataset (a run has one model: a profile that compares models makes one run each),
which take the place of [run]'s, as if typed (a flag typed on the command line still wins). A run's optional
`flags` (a list of words, e.g. ["--accum", "8", "--steps", "25"]) follow the command line's, so they set
that run's configuration from a fresh model: runs that differ in more than the world size (HPML Lab 4 Q4).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ddptop.errors import UsageError
from ddptop.profiles import CODE_KEYS, check_code, find_profile, read_profile


KEYS = {"nodes", "link", "cpus_per_node", "runs"}
RUN_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,39}$")


RUN_FLAGS = ("model", "dataset")  # what a run may set of its own, besides its name and nodes


@dataclass(frozen=True)
class Run:
    name: str
    nodes: int
    model: str | None = None
    dataset: str | None = None
    flags: tuple[str, ...] = ()  # this run's own ddptop flags, after the command line's

    def argv(self) -> list[str]:
        """The run's own model and dataset, put before the typed flags (so that those still win)."""
        return [w for key in RUN_FLAGS if getattr(self, key) is not None for w in (f"--{key}", getattr(self, key))]


@dataclass(frozen=True)
class LabSettings:
    nodes: int | None = None
    link: str | None = None
    cpus_per_node: str | None = None
    runs: tuple[Run, ...] = field(default_factory=tuple)


def lab_settings(profile: str | None) -> LabSettings:
    """The `[lab]` table of a profile (empty settings without a profile or table); UsageError when malformed."""
    if not profile:
        return LabSettings()
    path = find_profile(profile)
    table = read_profile(path).get("lab", {})
    where = f"profile {path.name} [lab]"
    if not isinstance(table, dict):
        raise UsageError(f"{where}: must be a table")
    unknown = sorted(set(table) - KEYS)
    if unknown:
        raise UsageError(f"{where}: unknown setting(s) {', '.join(unknown)} (known: {', '.join(sorted(KEYS))})")
    nodes = table.get("nodes")
    if nodes is not None and (not isinstance(nodes, int) or isinstance(nodes, bool) or nodes < 1):
        raise UsageError(f"{where}: nodes must be a whole number ≥ 1, got {nodes!r}")
    link = table.get("link")
    if link is not None and not isinstance(link, str):
        raise UsageError(f"{where}: link must be a string like \"1gbit\", got {link!r}")
    cpus = table.get("cpus_per_node")
    if cpus is not None and (isinstance(cpus, bool) or not isinstance(cpus, (int, float, str))):
        raise UsageError(f"{where}: cpus_per_node must be a number or \"unlimited\", got {cpus!r}")
    runs = tuple(_run(item, where, nodes) for item in _list(table.get("runs", []), where))
    check_code(path, [(key, value) for run in runs for key, value in _code(run)])
    if len({r.name for r in runs}) < len(runs):
        raise UsageError(f"{where}: two runs share a name")
    return LabSettings(nodes, link, None if cpus is None else str(cpus), runs)


def _list(value: object, where: str) -> list:
    if not isinstance(value, list):
        raise UsageError(f"{where}: runs must be a list of tables")
    return value


def _run(item: object, where: str, lab_nodes: int | None) -> Run:
    if not isinstance(item, dict) or set(item) - {"name", "nodes", "flags", *RUN_FLAGS}:
        raise UsageError(f"{where}: each run is a table with name and nodes (and optionally "
                         f"{', '.join(RUN_FLAGS)}, flags), got {item!r}")
    name, nodes = item.get("name"), item.get("nodes")
    if not isinstance(name, str) or not RUN_NAME.match(name):
        raise UsageError(f"{where}: a run's name must be letters, digits, '.', '_' or '-', got {name!r}")
    if not isinstance(nodes, int) or isinstance(nodes, bool) or nodes < 1:
        raise UsageError(f"{where}: run {name}: nodes must be a whole number ≥ 1, got {nodes!r}")
    if lab_nodes is not None and nodes > lab_nodes:
        raise UsageError(f"{where}: run {name} wants {nodes} nodes but the lab has {lab_nodes}")
    own = {key: item[key] for key in RUN_FLAGS if key in item}
    for key, value in own.items():  # the name itself (built-in or spec) is checked with the run's flags
        if not isinstance(value, str) or not value.strip() or value.startswith("-"):
            raise UsageError(f"{where}: run {name}: {key} must be a built-in name or a spec (text), got {value!r}")
    flags = item.get("flags", [])
    if not isinstance(flags, list) or not all(isinstance(f, str) for f in flags):
        raise UsageError(f"{where}: run {name}: flags must be a list of strings like [\"--accum\", \"8\"], got {flags!r}")
    return Run(name, nodes, **own, flags=tuple(flags))


def _code(run: Run) -> list[tuple[str, str]]:
    """What a run names of code: its model and dataset, and --model/--dataset/--loss among its own flags."""
    out = [(key, getattr(run, key)) for key in RUN_FLAGS if getattr(run, key) is not None]
    for flag, value in zip(run.flags, run.flags[1:]):
        if flag.lstrip("-") in CODE_KEYS:
            out.append((flag.lstrip("-"), value))
    for flag in run.flags:
        key, equals, value = flag.lstrip("-").partition("=")
        if equals and key in CODE_KEYS:
            out.append((key, value))
    return out
