"""The CLI reference cannot drift (issue 46): docs/reference/cli.md is every command's `--help` as ddptop's argument
parsers print it (scripts/cli_reference.py writes it); a flag added, renamed or reworded without rewriting the page
fails here, with the command that rewrites it."""

from __future__ import annotations

import difflib
import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_committed_cli_reference_is_what_the_parsers_print(monkeypatch):
    spec = importlib.util.spec_from_file_location("cli_reference", ROOT / "scripts" / "cli_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setenv("COLUMNS", "100")
    made, committed = module.page(), (ROOT / "docs" / "reference" / "cli.md").read_text()
    diff = "".join(difflib.unified_diff(committed.splitlines(True), made.splitlines(True), "committed", "parsers", n=1))
    assert made == committed, f"docs/reference/cli.md is stale: python scripts/cli_reference.py\n{diff[:4000]}"
    for command in ("ddptop ctl", "ddptop report", "ddptop lab exec", "ddptop advise"):
        assert f"## `{command}`" in committed and f"usage: {command}" in committed
