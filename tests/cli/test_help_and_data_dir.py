"""Issue 26 items 4-5 as a user meets them: a mistyped --data-dir creates nothing, and `lab` is in every help.

Each case runs `python -m ddptop` in a process of its own in an empty folder and then looks at the folder itself:
what is on disk afterwards is the ground truth, not what ddptop says it did.
"""

from __future__ import annotations

import pytest

from test_run_cli import assert_one_line_error, ddptop

OTHER_COMMANDS = ("ctl", "attach", "info", "replay", "export", "report", "lab", "advise")


@pytest.mark.parametrize("argv, code, words", [
    (["--dataset", "cifar10", "--data-dir", "nonexistent/dir"], 3, ["nonexistent/dir does not exist"]),
    (["--dataset", "mnist"], 3, ["data does not exist"]),  # the default ./data
    (["--data-dir", "mydata"], 2, ["--data-dir is for --dataset cifar10, mnist or your own"]),
], ids=["typo", "default", "synthetic"])
def test_a_data_dir_is_never_created(tmp_path, argv, code, words):
    result = ddptop(*argv, "--local", "1", "--headless", "--model", "tiny", "--no-record", cwd=tmp_path, timeout=60)
    assert_one_line_error(result, code, *words)
    assert result.stderr.count("\n") == 1, result.stderr
    assert list(tmp_path.iterdir()) == []


def test_lab_is_in_the_help_and_in_the_suggestions():
    listed = ddptop("--help").stdout
    commands = listed[listed.index("\ncommands ("):listed.index("\nprofiles (")]  # the sections, not a flag's words
    assert all(f"\n  {name} " in commands for name in OTHER_COMMANDS), commands
    typo = ddptop("labb")
    assert_one_line_error(typo, 2, "unknown command 'labb'", ", ".join(OTHER_COMMANDS))
    lab_help = ddptop("lab", "--help").stdout
    assert all(f"\n  {name} " in lab_help for name in ("exec", "list", "clean")), lab_help


def test_lab_list_with_no_lab_says_so(tmp_path):
    result = ddptop("lab", "list", env={"DDPTOP_LAB_DIR": str(tmp_path)})  # a state folder no lab uses
    assert (result.returncode, result.stdout, result.stderr) == (0, "no lab is running on this machine\n", "")
