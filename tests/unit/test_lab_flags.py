"""`ddptop lab`'s flags and profiles, checked before anything is built: rates, quotas, [lab] tables, one-line errors."""

from __future__ import annotations

import pytest

from ddptop.cli import main
from ddptop.errors import UsageError
from ddptop.lab.links import Link, parse_link
from ddptop.lab.profile import Run, lab_settings


@pytest.mark.parametrize("text,bits", [("100mbit", 100e6), ("1gbit", 1e9), ("10gbit", 10e9), ("2.5gbit", 2.5e9),
                                       ("200MBIT", 200e6), ("unlimited", None)])
def test_link_rates(text, bits):
    assert parse_link(text) == Link(bits)


@pytest.mark.parametrize("text", ["fast", "100", "100mbps", "1 gbit/s", "-1gbit", "0mbit", "200gbit", ""])
def test_bad_link_rates_are_usage_errors(text):
    with pytest.raises(UsageError, match="--link"):
        parse_link(text)


def test_tbf_holds_a_millisecond_of_the_rate_and_a_20ms_queue():
    assert Link(1e9).tbf() == ["tbf", "rate", "1000000000bit", "burst", "125000", "limit", "2500000"]
    assert Link(10e6).tbf()[4] == "3028"  # at least two full frames, however slow the link
    assert Link(None).burst_bytes == 0


@pytest.mark.parametrize("argv,words", [
    (["--link", "fast"], "--link"),
    (["--nodes", "0"], "--nodes must be at least 1"),
    (["--local", "2"], "drop --local"),
    (["--master", "10.0.0.1", "--rank", "0", "--world-size", "2"], "drop --master, --rank, --world-size"),
    (["--cpus-per-node", "lots"], "--cpus-per-node"),
    (["--cpus-per-node", "0"], "--cpus-per-node must be between"),
    (["--strategy", "nope"], "invalid choice"),
    (["--record", "a.db", "--record-dir", "d"], "not both"),
    (["--subnet", "192.0.2.0/30", "--nodes", "4"], "room for 2 hosts"),
    (["--profile", "no-such-profile"], "no profile"),
])
def test_bad_lab_flags_get_one_line_and_exit_2_before_anything_is_built(argv, words, capsys):
    assert main(["lab", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("ddptop: ") and words in err[0], err


def test_the_lab_profiles_carry_their_cluster():
    assert lab_settings("cs744-lab").nodes == 4 and lab_settings("cs744-lab").link == "1gbit"
    assert lab_settings("hpml-lab4-lab").runs == (Run("1node", 1), Run("2nodes", 2), Run("4nodes", 4))
    assert lab_settings("cs744-compare").nodes is None  # a profile without [lab]: the lab's own defaults
    assert lab_settings("lecture-buckets-lab").runs == (Run("resnet50", 2, "resnet50"), Run("bert-mini", 2, "bert-mini"))
    q4 = lab_settings("hpml-lab4-q4").runs  # runs with their own flags: the same samples at batch 128 and 1,024
    assert [(r.name, r.flags) for r in q4][:2] == [("b128", ()), ("b1024", ("--accum", "8"))]


def test_a_run_trains_its_own_model_unless_a_flag_is_typed():
    """A run's model (and dataset) come before the typed flags: its own over [run]'s, a typed --model over both;
    bert-mini's run gets its token set by default."""
    from ddptop.cli.lab import _run_config

    typed = ["--profile", "lecture-buckets-lab"]
    bert = _run_config(Run("b", 2, "bert-mini"), typed)
    assert (bert.model, bert.dataset, len(bert.sweep)) == ("bert-mini", "tokens", 12)
    assert _run_config(Run("r", 2, "resnet50"), typed).model == "resnet50"
    assert _run_config(Run("b", 2, "bert-mini"), [*typed, "--model", "tiny"]).model == "tiny"
    assert _run_config(Run("t", 1, "tiny", "mnist"), typed).dataset == "mnist"
    assert Run("t", 1, "tiny", "mnist").argv() == ["--model", "tiny", "--dataset", "mnist"] and Run("a", 1).argv() == []


@pytest.mark.parametrize("run,words", [
    ('{ name = "a", nodes = 1, model = "gpt-9" }', "run a: unknown model 'gpt-9'"),
    ('{ name = "a", nodes = 1, model = 5 }', "run a: model must be a built-in name or a spec"),
    ('{ name = "a", nodes = 1, dataset = "" }', "run a: dataset must be a built-in name or a spec"),
    ('{ name = "a", nodes = 1, model = "--lr" }', "run a: model must be a built-in name or a spec"),
    ('{ name = "a", nodes = 1, dataset = "imagenet" }', "run a: unknown dataset 'imagenet'"),
    ('{ name = "a", nodes = 1, batch_size = 8 }', "(and optionally model, dataset, flags)"),
])
def test_a_bad_model_or_dataset_in_a_run_is_one_line_and_exit_2_before_anything_is_built(run, words, tmp_path,
                                                                                           capsys):
    profile = tmp_path / "bad.toml"
    profile.write_text(f"[lab]\nnodes = 1\nruns = [{run}]\n")
    assert main(["lab", "--profile", str(profile)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("ddptop: ") and words in err[0], err


@pytest.mark.parametrize("table,words", [
    ("[lab]\nnodes = 0\n", "nodes must be a whole number"),
    ("[lab]\nlink = 1\n", "link must be a string"),
    ("[lab]\nspeed = \"1gbit\"\n", "unknown setting(s) speed"),
    ("[lab]\nnodes = 2\nruns = [{ name = \"big\", nodes = 4 }]\n", "wants 4 nodes but the lab has 2"),
    ("[lab]\nruns = [{ name = \"a b\", nodes = 1 }]\n", "a run's name"),
    ("[lab]\nruns = [{ name = \"a\", nodes = 1 }, { name = \"a\", nodes = 2 }]\n", "share a name"),
    ("[lab]\nruns = [{ name = \"a\", nodes = 1, flags = \"--accum 8\" }]\n", "flags must be a list of strings"),
])
def test_malformed_lab_tables_are_usage_errors(table, words, tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text(table)
    with pytest.raises(UsageError) as caught:
        lab_settings(str(path))
    assert words in str(caught.value)


def test_several_runs_are_recorded_into_a_folder_never_over_a_file(tmp_path, capsys):
    profile = tmp_path / "three.toml"
    profile.write_text("[lab]\nnodes = 2\nruns = [{ name = \"a\", nodes = 1 }, { name = \"b\", nodes = 2 }]\n")
    assert main(["lab", "--profile", str(profile), "--record", str(tmp_path / "x.db")]) == 2
    assert "record them with --record-dir" in capsys.readouterr().err
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "three-b.db").write_text("")
    assert main(["lab", "--profile", str(profile), "--record-dir", str(tmp_path / "out")]) == 2
    assert "three-b.db exists" in capsys.readouterr().err


@pytest.mark.parametrize("flags,words", [('["--accum", "0"]', "accum must be a whole number"),
                                         ('["--rank", "1"]', "places the ranks itself: drop --rank"),
                                         ('["--no-such-flag"]', "unrecognized arguments")])
def test_a_runs_own_flags_are_checked_before_anything_is_built(flags, words, tmp_path, capsys):
    profile = tmp_path / "runs.toml"
    profile.write_text(f'[lab]\nnodes = 2\nruns = [{{ name = "a", nodes = 2 }}, {{ name = "b", nodes = 2, flags = {flags} }}]\n')
    assert main(["lab", "--profile", str(profile), "--record-dir", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and words in err[0], err
