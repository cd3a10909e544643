"""Fixtures shared by the CLI tests: a small disk of the test's own (a real tmpfs, as root)."""

from __future__ import annotations

import os
import subprocess

import pytest


@pytest.fixture
def small_disk(tmp_path):
    """A 2 MB tmpfs of this test's own (unmounted afterwards, whatever happens)."""
    mount = tmp_path / "disk"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", f"ddptop-test-{os.getpid()}", str(mount)], check=True)
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)
