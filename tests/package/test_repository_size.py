"""The repository stays light (issue 46): the tracked tree under 15 MB, as `git ls-files -z | xargs -0 du -cb`
counts it (91.8 MB before: reports, a what-if grid and a TUI fixture committed whole). Generated things are made
(`make reports`), not committed; CONTRIBUTING.md says how each is remade."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LIMIT = 15_000_000


def test_the_tracked_tree_is_under_15_mb():
    names = subprocess.run(["git", "ls-files", "-z"], capture_output=True, cwd=ROOT, timeout=60, check=True).stdout
    files = [ROOT / n.decode() for n in names.split(b"\0") if n]
    sizes = {str(f.relative_to(ROOT)): f.stat().st_size for f in files if f.is_file() and not f.is_symlink()}
    total = sum(sizes.values())
    biggest = sorted(sizes.items(), key=lambda kv: -kv[1])[:8]
    assert total <= LIMIT, f"tracked files hold {total:,} bytes, over {LIMIT:,}; the largest: {biggest}"
