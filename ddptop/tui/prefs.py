"""Provides the screen's preferences (its theme, the overview's hidden sections), kept in the user's config folder.

One small JSON file, `$XDG_CONFIG_HOME/ddptop/screen.json` (default `~/.config/ddptop/screen.json`), written whole
(safe.replacing) when the user changes something on the screen, read when a screen opens. A file that is not what
ddptop writes is read as the defaults and said once; nothing in it is ever executed or shown unchecked.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from ddptop.safe import clean, replacing

# the overview's sections, in the order it draws them: (key, what the toggle list calls it)
SECTIONS = (("hints", "hints"), ("ranks", "ranks table"), ("time", "where a step's time goes"),
            ("segments", "segments table"), ("trends", "loss, step time and communication plots"),
            ("network", "network"), ("utilization", "utilization"))
THEMES = ("dark", "light")
THEME_ENV = "DDPTOP_THEME"  # --theme, for this session only (cli.parser.screen_flags)
MAX_BYTES = 4096  # what ddptop writes is under 300 bytes: anything larger is not ours


@dataclass(frozen=True)
class Prefs:
    theme: str = "dark"
    hidden: frozenset[str] = field(default_factory=frozenset)  # keys of SECTIONS


def path() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "ddptop" / "screen.json"


def load() -> tuple[Prefs, str]:
    """The saved preferences (the theme --theme gave instead, if any), and a line to show when the file was there
    but unusable ('' otherwise)."""
    prefs, problem = _saved()
    forced = os.environ.get(THEME_ENV)
    if forced in THEMES:
        prefs = Prefs(theme=forced, hidden=prefs.hidden)
    return prefs, problem


def _saved() -> tuple[Prefs, str]:
    where = path()
    try:
        with open(where, "rb") as f:
            raw = f.read(MAX_BYTES + 1)
    except FileNotFoundError:
        return Prefs(), ""
    except OSError as e:
        return Prefs(), f"screen preferences not read ({clean(str(where))}: {clean(e.strerror or str(e))})"
    try:
        data = json.loads(raw) if len(raw) <= MAX_BYTES else None
    except ValueError:
        data = None
    names = {key for key, _ in SECTIONS}
    if (not isinstance(data, dict) or data.get("theme", "dark") not in THEMES
            or not isinstance(data.get("hidden", []), list)
            or not all(isinstance(h, str) and h in names for h in data.get("hidden", []))):
        return Prefs(), f"screen preferences ignored: {clean(str(where))} is not what ddptop writes"
    return Prefs(theme=data.get("theme", "dark"), hidden=frozenset(data.get("hidden", []))), ""


def save(prefs: Prefs) -> str:
    """Write the preferences; '' when saved, else a line saying why not (the screen goes on either way)."""
    where = path()
    try:
        where.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        with replacing(where, perms=0o600) as f:
            json.dump({"theme": prefs.theme, "hidden": sorted(prefs.hidden)}, f)
    except OSError as e:
        return f"screen preferences not saved ({clean(str(where))}: {clean(e.strerror or str(e))})"
    return ""
