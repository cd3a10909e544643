"""A folder someone else filled (issue 41): `./profiles/smoke.toml` there shadowed ddptop's own smoke, and its
`model = "helpers/tiny.py:Tiny"` was imported in the front and both ranks; `--help` showed its description and
`report` its `[[reference]]`. Now a plain name is ddptop's own profile only (README: profiles), and a profile's code
runs only from a file the user named by its path. Each test runs the real CLI in a temporary folder whose planted
module writes a marker file when it is imported: the marker must not appear."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PLANTED = "PLANTED-DESCRIPTION-41"
MODULE = '''import pathlib
pathlib.Path(__file__).resolve().parent.parent.joinpath("MARKER").write_text("imported")
import torch


def Tiny(num_classes=10):
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 32 * 32, num_classes))


def mlp(num_classes=10):
    return Tiny(num_classes)
'''


def _plant(folder: Path) -> Path:
    (folder / "profiles").mkdir()
    (folder / "helpers").mkdir()
    (folder / "helpers" / "tiny.py").write_text(MODULE)
    (folder / "examples").mkdir()
    (folder / "examples" / "wide_mlp.py").write_text(MODULE)
    (folder / "profiles" / "smoke.toml").write_text(
        f'# {PLANTED}\n[run]\nmodel = "helpers/tiny.py:Tiny"\nbatch_size = 8\n')
    (folder / "profiles" / "cs744-lab.toml").write_text(
        f'# {PLANTED}\n[[reference]]\nsource = "{PLANTED}"\nrows = [{{ strategy = "ddp", step_s = 1.0 }}]\n')
    return folder / "MARKER"


def _ddptop(folder: Path, *argv: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ddptop", *argv], capture_output=True, text=True, timeout=timeout,
                          cwd=folder, env={**os.environ, "PYTHONPATH": str(REPO),
                                           "DDPTOP_STATE_DIR": str(folder / "jobs")})


def test_a_planted_profile_never_shadows_ddptops_own_nor_runs_its_code(tmp_path):
    marker = _plant(tmp_path)
    helped = _ddptop(tmp_path, "--help")
    assert helped.returncode == 0 and PLANTED not in helped.stdout and "every strategy" in helped.stdout
    record = tmp_path / "smoke.db"
    result = _ddptop(tmp_path, "--headless", "--profile", "smoke", "--local", "2", "--record", str(record))
    assert result.returncode == 0, result.stderr
    assert not marker.exists(), "the planted profile's module was imported"
    assert "./profiles/smoke.toml is not used" in result.stderr, result.stderr
    with sqlite3.connect(record) as db:  # ddptop's own smoke: the tiny model, its five strategies
        model = db.execute("SELECT json_extract(value, '$.model') FROM meta WHERE key = 'config'").fetchone()[0]
        strategies = [s for (s,) in db.execute("SELECT json_extract(config, '$.strategy') FROM segments "
                                               "ORDER BY segment")]
    assert model == "tiny" and strategies == ["single", "gather-scatter", "allreduce", "allreduce", "ddp"], strategies


def test_ddptops_own_profile_imports_ddptops_own_module_never_this_folders(tmp_path, monkeypatch):
    """wire-lab names ddptop.examples.wide_mlp, a module of the ddptop package (issue 46: it was the path
    examples/wide_mlp.py, from the current folder, so the profile ran only from ddptop's checkout): from a folder
    with a planted examples/wide_mlp.py, ddptop's own module is the one imported, and nothing of the folder's."""
    from ddptop.cli.run import run_parser
    from ddptop.profiles import load_profile
    from ddptop.train import specs

    marker = _plant(tmp_path)
    monkeypatch.chdir(tmp_path)
    flags = {a.dest: a for a in run_parser()._actions}
    model = load_profile("wire-lab", flags)["run"]["model"]
    assert model == "ddptop.examples.wide_mlp:mlp"
    made = specs.load("--model", model)
    assert Path(made.__code__.co_filename).resolve().parent == REPO / "ddptop" / "examples"
    assert not marker.exists()


def test_an_own_profile_naming_code_outside_ddptop_is_refused_in_one_line(tmp_path, monkeypatch):
    """Were one of ddptop's own profiles to name a file or a module of the current folder, that would be someone
    else's code wherever ddptop runs: one UsageError line naming it, before anything is imported."""
    import pytest

    from ddptop import profiles
    from ddptop.errors import UsageError

    marker = _plant(tmp_path)
    own = tmp_path / "own"
    own.mkdir()
    monkeypatch.setattr(profiles, "OWN_DIR", own)
    monkeypatch.chdir(tmp_path)
    for spec in ("examples/wide_mlp.py:mlp", "helpers.tiny:Tiny", "ddptop/examples/wide_mlp.py:mlp"):
        (own / "x.toml").write_text(f'[run]\nmodel = "{spec}"\n')
        with pytest.raises(UsageError) as exc:
            profiles.check_code(own / "x.toml", [("model", spec)])
        assert "not ddptop's own" in str(exc.value) and "\n" not in str(exc.value), exc.value
    assert not marker.exists()


def test_the_reports_published_figures_come_from_ddptops_own_profile_only(tmp_path):
    _plant(tmp_path)
    out = tmp_path / "report"
    result = _ddptop(tmp_path, "report", str(REPO / "recordings" / "cs744-lab.db"), "-o", str(out))
    assert result.returncode == 0, result.stderr
    text = (out / "report.md").read_text()
    assert PLANTED not in text and "CS744 Spring 2025 Assignment 2 report" in text


def test_a_profile_of_yours_that_names_code_says_whose_code_runs_and_bad_code_stays_one_line(tmp_path):
    """Issue 46: a profile given by its path that names code says so, naming the file, once the code passed its check
    (a spec that fails is still its one line, exit 2, with no note before it); a typed --model over the profile's
    leaves the profile's model out of the note."""
    (tmp_path / "mine.py").write_text("import torch\n\n\ndef Tiny(num_classes=10):\n"
                                      "    return torch.nn.Sequential(torch.nn.Flatten(), "
                                      "torch.nn.Linear(3 * 32 * 32, num_classes))\n")
    (tmp_path / "p.toml").write_text('[run]\nmodel = "mine.py:Tiny"\nbatch_size = 8\nsynthetic_size = 64\n'
                                     'no_eval = true\n')
    (tmp_path / "bad.toml").write_text('[run]\nmodel = "mine.py:Missing"\n')
    small = ("--headless", "--local", "1", "--steps", "2", "--no-record")
    ran = _ddptop(tmp_path, "--profile", "./p.toml", *small)
    assert ran.returncode == 0, ran.stderr
    notes = [line for line in ran.stderr.splitlines() if "runs the code it names as yours" in line]
    assert len(notes) == 1 and str(tmp_path / "mine.py") in notes[0] and "model = 'mine.py:Tiny'" in notes[0], notes
    bad = _ddptop(tmp_path, "--profile", "./bad.toml", *small)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "Missing" in bad.stderr, bad.stderr
    from ddptop import profiles

    run = {"model": "mine.py:Tiny", "batch_size": 8}
    assert profiles.code_note(tmp_path / "p.toml", run, {"model": "tiny"}) == ""  # --model tiny typed over it
    assert profiles.code_note(profiles.OWN_DIR / "wire-lab.toml", {"model": "ddptop.examples.wide_mlp:mlp"},
                              {"model": "ddptop.examples.wide_mlp:mlp"}) == ""  # ddptop's own: ddptop's code
