"""Run profiles: `NAME.toml` gives flag defaults and an optional sweep; typed flags still win.

A plain name is one of ddptop's own profiles (OWN_DIR: the package's own_profiles/, package data read through
importlib.resources, so an installed wheel has them wherever it runs), never a file of the current folder, which may
be anyone's; a profile of your own is given by its path, and only such a file's code (`model = "x.py:M"`) is taken
as yours. ddptop's own profiles name only ddptop's own code (`ddptop.examples.wide_mlp:mlp`)."""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from ddptop.config import is_spec
from ddptop.errors import UsageError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

OWN_DIR = Path(str(resources.files("ddptop").joinpath("own_profiles")))  # ddptop's own: what a plain name means
SWEEP_KEYS = {"strategy", "bucket_mb", "async_op", "batch_size", "lr", "accum", "compress", "lr_warmup_steps",
              "shard_unit"}
CODE_KEYS = ("model", "dataset", "loss", "collate", "tokens")  # settings whose value may name code (config.is_spec)


def find_profile(name: str) -> Path:
    """`NAME`: ddptop/own_profiles/NAME.toml (package data); `path/to/FILE.toml`: that file, which the user chose."""
    if by_path(name):
        candidate = Path(name)
        if not candidate.is_file():
            raise UsageError(f"no profile file {name}")
        return candidate
    path = OWN_DIR / f"{name}.toml"
    if NAME.match(name) and path.is_file():
        return path
    known = ", ".join(own_profiles()) or "(none found)"
    here = Path("profiles") / f"{name}.toml"
    mine = f"; ./{here} is this folder's: give its path to use it (--profile ./{here})" \
        if NAME.match(name) and here.is_file() else "; a profile of your own by its path (--profile FILE.toml)"
    raise UsageError(f"no profile {name!r} of ddptop's: choose one of {known}{mine}")


def by_path(name: str) -> bool:
    return name.endswith(".toml") or "/" in name or os.sep in name


def own_profiles() -> list[str]:
    return sorted(p.stem for p in OWN_DIR.glob("*.toml")) if OWN_DIR.is_dir() else []


def is_own(path: Path) -> bool:
    return path.resolve().parent == OWN_DIR.resolve()


def shadowed_note(name: str, path: Path) -> str:
    """One line when ./profiles/NAME.toml exists beside ddptop's own NAME, which was used instead ('' otherwise)."""
    here = Path("profiles") / f"{name}.toml"
    if by_path(name) or not here.is_file() or here.resolve() == path.resolve():
        return ""
    return (f"ddptop: profile {name} is ddptop's own; ./{here} is not used (give its path to use it: "
            f"--profile ./{here})")


def check_code(path: Path, values: list[tuple[str, Any]]) -> None:
    """A profile's code runs only as the user's: from a profile file they named by its path. ddptop's own profiles
    may name only ddptop's own modules (wire-lab's `ddptop.examples.wide_mlp:mlp`, imported from the package that is
    already loaded, wherever ddptop runs), never a file or module that is someone else's where ddptop runs: one
    UsageError line instead."""
    if not is_own(path):
        return  # the user named this file: its code is theirs to run
    for key, value in values:
        if not is_spec(value) or str(value).startswith("torchvision:"):
            continue
        where = str(value).rpartition(":")[0]
        if where.startswith("ddptop.") and not where.endswith(".py"):
            continue  # a submodule of the ddptop package, found under its own folder whatever the current folder
        found = os.path.realpath(where) if where.endswith(".py") else ""
        shown = f", which here is {found}" if found else " (a module found on this folder's path)"
        raise UsageError(f"profile {path.stem}: {key} = {value!r} names {where}{shown}, not ddptop's own: "
                         "copy the profile and give its path (--profile ./FILE.toml) to run code of yours")


def code_note(path: Path, run: dict[str, Any], used: dict[str, Any]) -> str:
    """One line naming the code a profile of the user's makes ddptop run, and whose it is (issue 46): each of its
    model, dataset, loss and collate specs that the run still uses (`used`: a typed flag may have replaced it), with the file
    it names. '' for ddptop's own profiles (their code is ddptop's) and for a profile that names no code."""
    if is_own(path):
        return ""
    named = []
    for key in CODE_KEYS:
        value = run.get(key)
        if not is_spec(value) or str(value).startswith("torchvision:") or used.get(key) != value:
            continue
        where = str(value).rpartition(":")[0]
        named.append(f"{key} = {value!r} ({os.path.realpath(where) if where.endswith('.py') else 'module ' + where})")
    if not named:
        return ""
    return f"ddptop: profile {path} runs the code it names as yours (you gave its path): {'; '.join(named)}"


def read_profile(path: Path) -> dict[str, Any]:
    """A profile file's TOML, or one UsageError line saying why it cannot be read."""
    try:
        return tomllib.loads(path.read_text())
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise UsageError(f"profile {path} cannot be read: {exc}") from None


MAX_SWEEP_STEPS = 1_000_000  # warm-up or measured steps per configuration: more is a typo, not a plan
SWEEP_TYPES = {"strategy": (str,), "bucket_mb": (int, float), "async_op": (bool,), "batch_size": (int,),
               "lr": (int, float), "accum": (int,), "compress": (str,), "lr_warmup_steps": (int,),
               "shard_unit": (str,)}
NOT_IN_PROFILES = {"help", "version", "profile"}


def load_profile(name: str, flags: dict[str, Any]) -> dict[str, Any]:
    """{"name", "run": flag defaults, "sweep": [sync changes], "warmup", "measure"} from a profile file.

    `flags` maps each run flag's dest to its argparse action: a value must have the type the flag takes (a
    profile bypasses argparse's conversion), and anything else is one UsageError line naming the setting."""
    path = find_profile(name)
    data = read_profile(path)
    where = f"profile {path.name}"
    check_code(path, [(k, v) for k, v in _table(data, "run", where).items() if k in CODE_KEYS])
    unknown = sorted(set(data) - {"run", "sweep", "lab", "reference"})  # [lab]: ddptop.lab.profile checks it
    if unknown:
        raise UsageError(f"{where}: unknown section(s) {', '.join(unknown)}: only [run], [sweep], [lab] and "
                         "[[reference]]")
    references(data, where)  # the report reads them; a mistake is said now, before the run
    run, sweep = _table(data, "run", where), _table(data, "sweep", where)
    bad = sorted(k for k in run if k not in flags or k in NOT_IN_PROFILES)
    if bad:
        raise UsageError(f"{where}: unknown setting(s) {', '.join(bad)} in [run]")
    for key, value in run.items():
        _check_flag(where, key, value, flags[key])
    extra = sorted(set(sweep) - {"warmup", "measure", "configs", "until_oom"})
    if extra:
        raise UsageError(f"{where}: unknown setting(s) {', '.join(extra)} in [sweep]")
    configs = sweep.get("configs", [])
    if not isinstance(configs, list):
        raise UsageError(f"{where}: [sweep] configs must be a list of tables like {{ strategy = \"ddp\" }}")
    for item in configs:
        bad = sorted(set(item) - SWEEP_KEYS) if isinstance(item, dict) else ["(not a table)"]
        if bad:
            raise UsageError(f"{where}: a sweep config sets {', '.join(bad)}; "
                             f"only {', '.join(sorted(SWEEP_KEYS))} can change between segments")
        for key, value in item.items():
            if not _typed(value, SWEEP_TYPES[key]):
                raise UsageError(f"{where}: sweep config {key} = {value!r} is not a {SWEEP_TYPES[key][0].__name__}")
    until_oom = sweep.get("until_oom", False)
    if not isinstance(until_oom, bool):
        raise UsageError(f"{where}: [sweep] until_oom must be true or false")
    return {"name": path.stem, "note": shadowed_note(name, path), "path": path, "run": run, "sweep": configs,
            "warmup": _steps(where, sweep, "warmup", 5, 0), "measure": _steps(where, sweep, "measure", 20, 1),
            "until_oom": until_oom}


def _table(data: dict, name: str, where: str) -> dict:
    value = data.get(name, {})
    if not isinstance(value, dict):
        raise UsageError(f"{where}: {name} must be a table ([{name}]), not {type(value).__name__}")
    return value


def _typed(value: Any, kinds: tuple) -> bool:
    if bool in kinds:
        return isinstance(value, bool)
    return isinstance(value, kinds) and not isinstance(value, bool)


def _check_flag(where: str, key: str, value: Any, action: Any) -> None:
    """A [run] value must be what the flag's argparse action would have produced from the command line."""
    if action.nargs == 0:  # store_true / store_false
        kinds: tuple = (bool,)
    elif action.type in (int, float):
        kinds = (int,) if action.type is int else (int, float)
    elif action.type is None:
        kinds = (str,)
    else:  # a converter such as --async-op's: true/false
        kinds = (bool,)
    if not _typed(value, kinds) or (float in kinds and not _finite(value)):
        raise UsageError(f"{where}: {key} = {value!r} is not a {kinds[-1].__name__}")
    if action.choices is not None and value not in action.choices:
        raise UsageError(f"{where}: {key} = {value!r}: choose one of {', '.join(map(str, action.choices))}")


def _finite(value: Any) -> bool:
    try:
        return value == value and abs(value) != float("inf")
    except OverflowError:
        return False


def _steps(where: str, sweep: dict, key: str, default: int, low: int) -> int:
    value = sweep.get(key, default)
    if not _typed(value, (int,)) or not low <= value <= MAX_SWEEP_STEPS:
        raise UsageError(f"{where}: [sweep] {key} must be a whole number of steps in {low}..{MAX_SWEEP_STEPS}, "
                         f"got {value!r}")
    return value


# [[reference]]: published figures the profile reproduces, shown beside the run's own in its report
REFERENCE_MATCH = {"strategy": (str,), "bucket_mb": (int, float), "async_op": (bool,), "batch_size": (int,)}
MAX_REFERENCES, MAX_REFERENCE_ROWS, MAX_SOURCE_CHARS = 8, 32, 300
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")


@dataclass(frozen=True)
class Reference:
    """One published source: each row a configuration (the keys a segment must match) and its seconds per step."""

    source: str
    rows: tuple[tuple[tuple[tuple[str, Any], ...], float], ...]  # ((("strategy", "ddp"), ...), step_s)


def references(data: dict, where: str) -> list[Reference]:
    """The profile's [[reference]] tables, checked: a source line, and rows like { strategy = "ddp", step_s = 0.87 }."""
    tables = data.get("reference", [])
    if not isinstance(tables, list) or len(tables) > MAX_REFERENCES or not all(isinstance(t, dict) for t in tables):
        raise UsageError(f"{where}: [[reference]] must be up to {MAX_REFERENCES} tables, each with source and rows")
    out = []
    for table in tables:
        source, rows = table.get("source"), table.get("rows")
        if set(table) - {"source", "rows"} or not isinstance(source, str) or not 0 < len(source) <= MAX_SOURCE_CHARS:
            raise UsageError(f"{where}: a [[reference]] has a source (text, up to {MAX_SOURCE_CHARS} characters) and "
                             "rows, nothing else")
        if not isinstance(rows, list) or not 0 < len(rows) <= MAX_REFERENCE_ROWS:
            raise UsageError(f"{where}: reference {source!r}: rows must be a list of 1 to {MAX_REFERENCE_ROWS} tables")
        out.append(Reference(source, tuple(_reference_row(row, f"{where}: reference {source!r}") for row in rows)))
    return out


def _reference_row(row: Any, where: str) -> tuple[tuple[tuple[str, Any], ...], float]:
    if not isinstance(row, dict) or set(row) - {*REFERENCE_MATCH, "step_s"}:
        raise UsageError(f"{where}: a row is a table of {', '.join(REFERENCE_MATCH)} and step_s, got {row!r}")
    step = row.get("step_s")
    if not _typed(step, (int, float)) or not _finite(step) or step <= 0:
        raise UsageError(f"{where}: step_s must be seconds > 0, got {step!r}")
    match = tuple(sorted((k, v) for k, v in row.items() if k != "step_s"))
    if not match:
        raise UsageError(f"{where}: a row names at least the strategy it is for")
    for key, value in match:
        if not _typed(value, REFERENCE_MATCH[key]):
            raise UsageError(f"{where}: {key} = {value!r} is not a {REFERENCE_MATCH[key][0].__name__}")
    return match, float(step)


def profile_references(name: str) -> list[Reference]:
    """The published figures of the profile a recording names: only a profile of ddptop's own folders, by a plain
    name (a recording's text never picks a file); none when there is no such profile. UsageError when malformed."""
    if not isinstance(name, str) or not NAME.match(name):
        return []
    path = OWN_DIR / f"{name}.toml"
    if not path.is_file():
        return []
    return references(read_profile(path), f"profile {path.name}")
