"""A package that installs anywhere (issue 46): `python -m build` makes an sdist and a wheel from it, `twine check`
passes both, and the wheel, installed into a fresh venv outside the checkout, runs ddptop's own profile and
`ddptop lab list` from a folder that is not the checkout, finding its profiles as package data.

The fresh venv gets torch and the other dependencies from this venv's site-packages through a .pth file (a 5 GB
install otherwise), written after the wheel is installed with --no-deps. A .pth line adds a folder to sys.path but
is not a site folder, so this venv's editable install of the checkout (its own .pth) is not seen there: the test
checks that `ddptop` is imported from the fresh venv."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from ports import port

REPO = Path(__file__).resolve().parents[2]
PROFILES = sorted(p.name for p in (REPO / "ddptop" / "own_profiles").glob("*.toml"))
EXAMPLES = sorted(p.name for p in (REPO / "ddptop" / "examples").glob("*.py"))


def _run(argv: list, timeout: float, **kw) -> subprocess.CompletedProcess:
    result = subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=timeout, **kw)
    assert result.returncode == 0, f"{argv}: exit {result.returncode}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    # --no-isolation: this venv's setuptools (the test extra), no index needed; the wheel is built from the sdist
    _run([sys.executable, "-m", "build", "--no-isolation", "--outdir", out, REPO], 300, cwd=REPO)
    return out


def test_the_sdist_and_the_wheel_carry_the_profiles_examples_and_license_and_pass_twine_check(built):
    wheel, = built.glob("ddptop-*.whl")
    sdist, = built.glob("ddptop-*.tar.gz")
    names = zipfile.ZipFile(wheel).namelist()
    assert {f"ddptop/own_profiles/{p}" for p in PROFILES} <= set(names), names
    assert {f"ddptop/examples/{p}" for p in EXAMPLES} <= set(names), names
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names), names
    check = _run([sys.executable, "-m", "twine", "check", "--strict", wheel, sdist], 120)
    assert check.stdout.count("PASSED") == 2, check.stdout


def test_the_wheel_in_a_fresh_venv_outside_the_checkout_runs_a_profile_and_lab_list(built, tmp_path):
    wheel, = built.glob("ddptop-*.whl")
    venv = tmp_path / "venv"
    # no PYTHONPATH anywhere: one naming the checkout would make pip think ddptop installed, and import it from there
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PIP_TARGET", "PIP_PREFIX")}
    env.update(DDPTOP_STATE_DIR=str(tmp_path / "state"), PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}")
    _run([sys.executable, "-m", "venv", venv], 180, env=env)
    python = venv / "bin" / "python"
    _run([python, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index", "--disable-pip-version-check", wheel],
         180, env=env)
    where = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    fresh = _run([python, "-c", where], 60, env=env).stdout.strip()
    ours = sysconfig.get_paths()["purelib"]  # torch, textual, ...: this venv's, by path
    Path(fresh, "deps-of-the-test-venv.pth").write_text(ours + "\n")
    away = tmp_path / "elsewhere"  # neither the checkout nor anything holding a profiles/ folder
    away.mkdir()
    where = _run([python, "-c", "import ddptop; print(ddptop.__file__)"], 60, cwd=away, env=env).stdout.strip()
    assert Path(where).resolve().is_relative_to(venv.resolve()), where  # the wheel's, not the checkout's
    ddptop = venv / "bin" / "ddptop"
    listed = _run([ddptop, "lab", "list"], 60, cwd=away, env=env)
    assert "lab" in listed.stdout, listed.stdout
    helped = _run([ddptop, "--help"], 60, cwd=away, env=env).stdout
    assert all(p.removesuffix(".toml") in helped for p in PROFILES), helped  # the profiles, found as package data
    ran = _run([ddptop, "--profile", "cs744-compare", "--headless", "--local", "2", "--model", "tiny",
                "--synthetic-size", "640", "--batch-size", "16", "--no-eval", "--backend", "gloo", "--port", port(),
                "--record", away / "compare.db"], 240, cwd=away, env=env)
    assert "finished: 100 steps on 2 ranks" in ran.stdout, ran.stdout[-2000:]
    assert (away / "compare.db").is_file()
