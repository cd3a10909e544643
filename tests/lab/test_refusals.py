"""Where namespaces are refused, `ddptop lab` says so in one line, exits 2 and leaves nothing (its state included)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from labs import REPO


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None, reason="needs root and setpriv")
def test_without_the_capabilities_for_namespaces_the_lab_is_one_line_and_exit_2(tmp_path):
    # root without CAP_SYS_ADMIN / CAP_NET_ADMIN: what a container without namespace support looks like
    drop = ["setpriv", "--inh-caps=-all", "--ambient-caps=-all", "--bounding-set=-all"]
    done = subprocess.run([*drop, sys.executable, "-m", "ddptop", "lab", "--nodes", "2", "--model", "tiny"],
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(REPO), "DDPTOP_LAB_DIR": str(tmp_path)})
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ddptop: cannot build the lab:") and "not permitted" in lines[0]
    assert os.listdir(tmp_path) == []
