"""The documentation site builds strictly (issue 46): `mkdocs build --strict` into a temporary folder, so a broken
link, a missing anchor or a page outside mkdocs.yml's nav fails here, as in CI. mkdocs-material is in the test
extra: no skip."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_mkdocs_build_strict_passes_and_every_nav_page_is_built(tmp_path):
    site = tmp_path / "site"
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(ROOT / "mkdocs.yml"), "-d",
                           str(site)], capture_output=True, text=True, timeout=300, cwd=ROOT,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert done.returncode == 0, done.stderr[-4000:]
    assert "WARNING" not in done.stderr, done.stderr[-4000:]
    for page in ("index.html", "getting-started/index.html", "reference/cli/index.html",
                 "reference/glossary/index.html", "how-to/hand-in/index.html", "evidence/gpu/index.html",
                 "explanation/trust-model/index.html"):
        assert (site / page).is_file(), page
    assert (site / "screens" / "overview-160x48.svg").is_file()  # the screenshot the home page shows


def test_the_readme_is_a_front_door_and_its_links_resolve():
    """README.md ≤ 300 lines (issue 46), and every relative link in it names a file of the repository."""
    import re

    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 300
    links = [t for t in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text) if not t.startswith("http")]
    assert links and all((ROOT / t).exists() for t in links), [t for t in links if not (ROOT / t).exists()]
