"""Run profiles: `profiles/NAME.toml` gives flag defaults and an optional sweep; typed flags still win."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from ddptop.errors import UsageError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

PROFILE_DIRS = (Path.cwd() / "profiles", Path(__file__).resolve().parent.parent / "profiles")
SWEEP_KEYS = {"strategy", "bucket_mb", "async_op", "batch_size", "lr"}


def find_profile(name: str) -> Path:
    candidate = Path(name)
    if candidate.suffix == ".toml" and candidate.is_file():
        return candidate
    for folder in PROFILE_DIRS:
        path = folder / f"{name}.toml"
        if path.is_file():
            return path
    known = sorted({p.stem for folder in PROFILE_DIRS if folder.is_dir() for p in folder.glob("*.toml")})
    raise UsageError(f"no profile {name!r}: choose one of {', '.join(known) or '(none found)'}")


def load_profile(name: str, known_flags: set[str]) -> dict[str, Any]:
    """{"name", "run": flag defaults, "sweep": [sync changes], "warmup", "measure"} from a profile file."""
    path = find_profile(name)
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise UsageError(f"profile {path} cannot be read: {exc}") from None
    run = data.get("run", {})
    unknown = sorted(set(run) - known_flags)
    if unknown:
        raise UsageError(f"profile {path.name}: unknown setting(s) {', '.join(unknown)} in [run]")
    sweep = data.get("sweep", {})
    configs = sweep.get("configs", [])
    for item in configs:
        bad = sorted(set(item) - SWEEP_KEYS) if isinstance(item, dict) else ["(not a table)"]
        if bad:
            raise UsageError(f"profile {path.name}: a sweep config sets {', '.join(bad)}; "
                             f"only {', '.join(sorted(SWEEP_KEYS))} can change between segments")
    until_oom = sweep.get("until_oom", False)
    if not isinstance(until_oom, bool):
        raise UsageError(f"profile {path.name}: [sweep] until_oom must be true or false")
    return {"name": path.stem, "run": run, "sweep": configs, "warmup": int(sweep.get("warmup", 5)),
            "measure": int(sweep.get("measure", 20)), "until_oom": until_oom}
