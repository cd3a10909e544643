"""Writes docs/reference/cli.md from ddptop's own argument parsers: each command's `--help`, as argparse prints it at
100 columns, so the page cannot drift from the flags (tests/docs/test_cli_reference.py fails when the committed page
differs from what the parsers print now).

    python scripts/cli_reference.py            # rewrite docs/reference/cli.md
    python scripts/cli_reference.py --check    # exit 1 and say so when the page is stale
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "reference" / "cli.md"
COMMANDS = [("ddptop", []), ("ddptop ctl", ["ctl"]), ("ddptop attach", ["attach"]), ("ddptop info", ["info"]),
            ("ddptop replay", ["replay"]), ("ddptop export", ["export"]), ("ddptop report", ["report"]),
            ("ddptop advise", ["advise"]), ("ddptop lab", ["lab"]), ("ddptop lab exec", ["lab", "exec"]),
            ("ddptop lab list", ["lab", "list"]), ("ddptop lab clean", ["lab", "clean"])]
HEAD = """# Command line

Every command's `--help`, as ddptop's argument parsers print it. This page is written by
`python scripts/cli_reference.py` and checked by `tests/docs/test_cli_reference.py`: a flag added, renamed or
reworded without rewriting the page fails the tests. Exit codes: [exit codes](exit-codes.md).
"""


def help_text(argv: list[str]) -> str:
    """`ddptop ARGV --help`'s output at 100 columns, run in this process."""
    from ddptop.cli import main

    os.environ["COLUMNS"] = "100"  # argparse wraps to the terminal: fixed, so the page is the same everywhere
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
        main([*argv, "--help"])
    return out.getvalue().rstrip() + "\n"


def page() -> str:
    parts = [HEAD]
    for title, argv in COMMANDS:
        parts.append(f"\n## `{title}`\n\n```text\n{help_text(argv)}```\n")
    return "".join(parts)


def main(argv: list[str]) -> int:
    sys.path.insert(0, str(ROOT))
    text = page()
    if argv == ["--check"]:
        if not PAGE.is_file() or PAGE.read_text() != text:
            print(f"{PAGE.relative_to(ROOT)} is not what the parsers print: python scripts/cli_reference.py",
                  file=sys.stderr)
            return 1
        return 0
    PAGE.parent.mkdir(parents=True, exist_ok=True)
    PAGE.write_text(text)
    print(f"wrote {PAGE.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
