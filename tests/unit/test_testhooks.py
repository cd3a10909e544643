"""The test hooks live in one module: `ddptop.testhooks` is the only file in ddptop that names a DDPTOP_TEST_*
variable, and it parses each the way the suite sets them (tests/README.md: test hooks out of the product)."""

from __future__ import annotations

import pathlib

import pytest

from ddptop.errors import UsageError

ROOT = pathlib.Path(__file__).resolve().parents[2] / "ddptop"
HOOKS = ROOT / "testhooks.py"


def test_only_the_injection_module_names_a_test_variable():
    """Every file under ddptop/ (source or not; compiled caches aside), read as bytes: the text DDPTOP_TEST appears
    in testhooks.py alone."""
    named = sorted(str(p.relative_to(ROOT)) for p in ROOT.rglob("*")
                   if p.is_file() and "__pycache__" not in p.parts and p != HOOKS and b"DDPTOP_TEST" in p.read_bytes())
    assert named == [], f"read a test hook through ddptop.testhooks instead: {named}"
    assert b"DDPTOP_TEST" in HOOKS.read_bytes()


def test_the_injection_module_imports_no_torch():
    """A base module: the front and the replay side import it without the torch stack."""
    import ast

    names = {a.name for n in ast.walk(ast.parse(HOOKS.read_text())) if isinstance(n, ast.Import) for a in n.names}
    names |= {n.module for n in ast.walk(ast.parse(HOOKS.read_text())) if isinstance(n, ast.ImportFrom)}
    assert not {m for m in names if m and m.split(".")[0] == "torch"}


def test_the_rank_hooks_parse_as_the_suite_sets_them(monkeypatch):
    from ddptop.testhooks import RankHooks, rank_hooks

    monkeypatch.setenv("DDPTOP_TEST_RANK", "straggle=1:40,from=1:60,clock=2:5,start=0:3000,join=0:1500,pg=2:700")
    assert rank_hooks(0) == RankHooks(start_s=3.0, join_s=1.5)
    assert rank_hooks(1) == RankHooks(delay_s=0.04, delay_from=60)
    assert rank_hooks(2) == RankHooks(clock_offset_s=5.0, pg_s=0.7)
    assert rank_hooks(3) == RankHooks()
    monkeypatch.delenv("DDPTOP_TEST_RANK")
    assert rank_hooks(1) == RankHooks()  # unset: every real run
    for bad, line in (("straggle=one:40", "DDPTOP_TEST_RANK: bad item 'straggle=one:40' (straggle=RANK:MS, "
                                          "from=RANK:STEP, clock=RANK:SECONDS, start=RANK:MS, join=RANK:MS, pg=RANK:MS)"),
                      ("drift=1:40", "DDPTOP_TEST_RANK: unknown item 'drift=1:40' (straggle=RANK:MS, "
                                     "from=RANK:STEP, clock=RANK:SECONDS, start=RANK:MS, join=RANK:MS, pg=RANK:MS)")):
        monkeypatch.setenv("DDPTOP_TEST_RANK", bad)
        with pytest.raises(UsageError) as err:
            rank_hooks(0)
        assert str(err.value) == line


def test_the_model_tweaks_parse_as_the_suite_sets_them(monkeypatch):
    from ddptop.testhooks import model_tweaks

    monkeypatch.setenv("DDPTOP_TEST_MODEL", "no-batch-norm, sleep-ms=40,data-sleep-ms=5,oom-batch=64,oom-rank=1")
    assert model_tweaks(1) == {"batch_norm": False, "sleep_s": 0.04, "data_sleep_s": 0.005, "oom_batch": 64}
    assert model_tweaks(0)["oom_batch"] == 2**62  # the same wrapper on every rank, one that never raises
    monkeypatch.delenv("DDPTOP_TEST_MODEL")
    assert model_tweaks(0) == {}
    monkeypatch.setenv("DDPTOP_TEST_MODEL", "bigger")
    with pytest.raises(UsageError) as err:
        model_tweaks(0)
    assert str(err.value) == ("DDPTOP_TEST_MODEL: unknown item 'bigger' (no-batch-norm, sleep-ms=N, "
                              "data-sleep-ms=N, oom-batch=N, oom-rank=R)")


@pytest.mark.parametrize("value, seconds", [("teardown:2500", 2.5), ("", 0.0), ("teardown:soon", 0.0),
                                            ("hold:2500", 0.0)])
def test_the_fronts_teardown_hold(monkeypatch, value, seconds):
    from ddptop.testhooks import teardown_hold_s

    monkeypatch.setenv("DDPTOP_TEST_FRONT", value)
    assert teardown_hold_s() == seconds


@pytest.mark.parametrize("value, steps", [("tune-steps:8", 8), ("", 0), ("tune-steps:many", 0), ("teardown:8", 0)])
def test_the_tuners_steps(monkeypatch, value, steps):
    from ddptop.front.tune import Tuner
    from ddptop.metrics.tune import STEPS
    from ddptop.testhooks import tune_steps

    monkeypatch.setenv("DDPTOP_TEST_FRONT", value)
    assert tune_steps() == steps
    assert Tuner(lambda: None).steps == (steps or STEPS)


def test_a_local_rank_takes_the_fronts_test_hooks_not_the_fork_servers(monkeypatch):
    """The suite runs jobs in its own process: their ranks fork from a server the first job started, whose
    environment is that moment's. A later job's DDPTOP_TEST_* reaches its ranks all the same (testhooks.carried,
    through WorkerOptions), and one the front no longer has is gone in the rank."""
    from ddptop import testhooks

    monkeypatch.setenv("DDPTOP_TEST_MODEL", "oom-batch=32")
    monkeypatch.setenv("DDPTOP_TEST_FRONT", "teardown:5")
    carried = testhooks.carried()
    assert carried == (("DDPTOP_TEST_FRONT", "teardown:5"), ("DDPTOP_TEST_MODEL", "oom-batch=32"))
    monkeypatch.delenv("DDPTOP_TEST_MODEL")  # the fork server's environment: another moment's
    monkeypatch.setenv("DDPTOP_TEST_RANK", "straggle=1:40")
    testhooks.adopt(carried)
    assert testhooks.model_tweaks(0) == {"oom_batch": 32} and testhooks.rank_hooks(1).delay_s == 0.0
