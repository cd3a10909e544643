"""`ddptop lab` as a user says what to type (issue 46): plain `sudo ddptop lab` finds no ddptop installed in a venv
(sudo's secure_path) and drops the environment; one line names the command that keeps both, exit 2."""

from __future__ import annotations

import os

from ddptop.cli import main


def test_lab_when_not_root_is_one_line_naming_the_sudo_that_works(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.setenv("DDPTOP_LAB_DIR", str(tmp_path))
    assert main(["lab", "--nodes", "2", "--model", "tiny"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "needs root" in err and 'sudo -E env "PATH=$PATH" ddptop lab' in err, err
    assert os.listdir(tmp_path) == []
