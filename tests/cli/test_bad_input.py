"""Every bad input is one line on stderr and a documented exit code: issue 14's cases, then property-based tests.

Most run `ddptop.cli.main` in this process (what `ddptop` runs; nothing here gets as far as starting a rank),
so hypothesis can try hundreds of inputs in seconds; the ones that need a process of their own use one.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import random
import shutil
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ddptop import cli
from ddptop.control.commands import SETTABLE, parse_assignments
from ddptop.errors import DdptopError
from ddptop.safe import clean
from test_run_cli import TINY, assert_one_line_error, ddptop

ROOT = Path(__file__).resolve().parents[2]
FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def main(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(list(argv))
    return code, out.getvalue(), err.getvalue()


def one_line(code: int, err: str, allowed: set[int], *words: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert code in allowed, err
    assert len(lines) == 1 and lines[0].startswith("ddptop: ") and "Traceback" not in err, err
    assert all(w in lines[0] for w in words), lines[0]
    return lines[0]


@pytest.mark.parametrize("argv", [["--port", "70000"], ["--port", "-5"], ["--port", "0"],
                                  ["ctl", "--port", "70000", "status"], ["attach", "--port", "65536"]])
def test_ports_outside_1_to_65535_are_refused(argv):
    one_line(*main(*argv)[::2], {2}, "between 1 and 65535")


def test_a_port_from_the_environment_is_checked_too(monkeypatch):
    for name, value in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                        "MASTER_PORT": "70000"}.items():
        monkeypatch.setenv(name, value)
    one_line(*main(*TINY)[::2], {2}, "between 1 and 65535", "70000", "torchrun")


def test_a_master_name_that_does_not_resolve_is_one_line_at_once():
    result = ddptop("--master", "nonexistent.invalid", "--rank", "0", "--world-size", "1", *TINY, timeout=60)
    assert_one_line_error(result, 4, "cannot find the master", "nonexistent.invalid")
    assert len(result.stderr.strip().splitlines()) == 1 and "frame #" not in result.stderr


@pytest.mark.parametrize("text, words", [
    ('sweep = "oops"', "sweep must be a table"),
    ('[sweep]\nwarmup = "five"\nconfigs = [{ strategy = "ddp" }]', "warmup must be a whole number"),
    ("run = [1, 2]", "run must be a table"),
    ('[sweep]\nwarmup = 1e17\nconfigs = [{ strategy = "ddp" }]', "warmup must be a whole number"),
    ("[sweep]\nwarmup = 100000000000000000\nconfigs = [{ strategy = \"ddp\" }]", "0..1000000"),
    ('[run]\nsteps = "many"', "steps = 'many' is not a int"),
    ('[run]\nmodel = "gpt"', "choose one of"),
    ('[sweep]\nconfigs = [{ strategy = 5 }]', "strategy = 5 is not a str"),
    ('[sweep]\nconfigs = [{ lr = nan }]', "learning rate"),
    ("[run\n", "cannot be read"),
    ('[reference]\nsource = "x"', "[[reference]] must be"),
    ('[[reference]]\nsource = "course"\nrows = []', "rows must be a list of 1 to 32"),
    ('[[reference]]\nrows = [{ strategy = "ddp", step_s = 1 }]', "has a source"),
    ('[[reference]]\nsource = "c"\nrows = [{ strategy = "ddp", step_s = -1 }]', "step_s must be seconds > 0"),
    ('[[reference]]\nsource = "c"\nrows = [{ strategy = "ddp", step_s = nan }]', "step_s must be seconds > 0"),
    ('[[reference]]\nsource = "c"\nrows = [{ step_s = 1.0 }]', "names at least the strategy"),
    ('[[reference]]\nsource = "c"\nrows = [{ strategy = "ddp", step_s = 1, gpu = "x" }]', "a row is a table of"),
    ('[[reference]]\nsource = "c"\nrows = [{ batch_size = "64", step_s = 1 }]', "batch_size = '64' is not a int"),
])
def test_a_bad_profile_is_one_line(tmp_path, text, words):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    one_line(*main("--profile", str(path), "--port", "0")[::2], {2}, *words.split(" ... "))


def test_a_cifar_batch_without_data_is_one_line_exit_3(tmp_path):
    sys.path.insert(0, str(ROOT / "tests" / "unit"))
    from test_data import PICKLE_STYLES, write_cifar

    write_cifar(tmp_path)
    batch = tmp_path / "cifar-10-batches-py" / "data_batch_2"
    batch.write_bytes(PICKLE_STYLES["str-keys"]({"labels": [1, 2, 3, 4]}))
    code, _, err = main("--dataset", "cifar10", "--data-dir", str(tmp_path), "--local", "1", *TINY)
    one_line(code, err, {3}, "data_batch_2", "needs 'data' and 'labels'", "no 'data'")


def test_a_start_that_fails_leaves_no_recording(tmp_path):
    import socket

    record = tmp_path / "run.db"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        result = ddptop("--local", "2", "--port", str(taken.getsockname()[1]), "--record", str(record), *TINY)
    assert_one_line_error(result, 4, "already in use")
    assert not list(tmp_path.iterdir()), "a failed start left a file that would block the retry"


def flipped(source: Path, folder: Path, count: int, seed: int = 14) -> list[Path]:
    """Copies of a real recording with one byte changed each, at offsets spread over the file."""
    data = source.read_bytes()
    rng = random.Random(seed)
    out = []
    for n in range(count):
        offset = rng.randrange(100, len(data))
        damaged = bytearray(data)
        damaged[offset] ^= 1 << rng.randrange(8)
        path = folder / f"flip{n}-{offset}.db"
        path.write_bytes(bytes(damaged))
        out.append(path)
    return out


def test_the_same_damage_gets_the_same_verdict_from_info_export_and_replay(tmp_path):
    rejected = 0
    for path in flipped(ROOT / "recordings" / "cs744-lab-buckets.db", tmp_path, 12):
        info = main("info", str(path))
        export = main("export", str(path), "--csv", str(tmp_path / f"{path.stem}-csv"))
        replay = main("replay", str(path), "--instant")
        codes = {info[0], export[0], replay[0]}
        assert len(codes) == 1 and codes <= {0, 6}, (path.name, info[2], export[2], replay[2])
        if codes == {6}:
            rejected += 1
            lines = {one_line(r[0], r[2], {6}) for r in (info, export, replay)}
            assert len(lines) == 1, lines  # the same words from each
            assert replay[1] == "" and export[1] == "", "output printed before the error"
    assert rejected >= 3  # the flips do damage something


# -- property-based: whatever the input, exit code in the documented set, one line, no traceback ---------------

SCALARS = st.one_of(st.integers(-10**20, 10**20), st.floats(), st.booleans(), st.text(max_size=10),
                    st.lists(st.integers(-5, 5), max_size=3))
RUN_KEYS = ["model", "batch_size", "steps", "lr", "strategy", "bucket_mb", "async_op", "local", "port", "timeout",
            "no_eval", "synthetic_size", "token", "record", "profile", "bogus", "threads", "span_every"]
SWEEP = st.fixed_dictionaries({}, optional={
    "warmup": SCALARS, "measure": SCALARS, "extra": SCALARS,
    "configs": st.one_of(SCALARS, st.lists(st.one_of(SCALARS, st.dictionaries(
        st.sampled_from(["strategy", "bucket_mb", "async_op", "batch_size", "lr", "seed"]), SCALARS, max_size=3)),
        max_size=3))})
PROFILE = st.fixed_dictionaries({}, optional={
    "run": st.one_of(SCALARS, st.dictionaries(st.sampled_from(RUN_KEYS), SCALARS, max_size=4)),
    "sweep": st.one_of(SCALARS, SWEEP), "other": SCALARS})


def toml(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return "nan" if value != value else ("inf" if value == float("inf") else
                                             "-inf" if value == float("-inf") else repr(value))
    if isinstance(value, (int, str)):
        return json.dumps(value) if isinstance(value, str) else str(value)
    if isinstance(value, list):
        return "[" + ", ".join(toml(v) for v in value) + "]"
    return "{" + ", ".join(f"{json.dumps(k)} = {toml(v)}" for k, v in value.items()) + "}"


@FAST
@given(doc=PROFILE, garbage=st.one_of(st.none(), st.text(max_size=40)))
def test_any_profile_file_is_one_line_and_exit_2(tmp_path_factory, doc, garbage):
    path = tmp_path_factory.mktemp("profile") / "p.toml"
    path.write_text(garbage if garbage is not None else "\n".join(f"{json.dumps(k)} = {toml(v)}"
                                                                  for k, v in doc.items()),
                    errors="surrogateescape")
    code, _, err = main("--profile", str(path), "--port", "0")  # a valid one stops at --port 0: nothing starts
    one_line(code, err, {2})


VALUES = st.one_of(st.text(max_size=12), st.integers(-10**30, 10**30).map(str), st.floats().map(repr),
                   st.sampled_from(["true", "no", "nan", "-inf", "1e400", "0", "ddp", "ring", "9" * 5000]))
ASSIGNMENTS = st.lists(st.one_of(st.text(max_size=16), st.builds(
    lambda k, v: f"{k}={v}", st.sampled_from([*SETTABLE, "bucket-mb", "x", ""]), VALUES)), max_size=4)


@FAST
@given(items=ASSIGNMENTS)
def test_any_ctl_set_values_are_one_line_and_exit_2(items):
    code, _, err = main("ctl", "--port", "0", "--token", "abcdefgh", "set", "--", *items)
    line = one_line(code, err, {2})
    try:
        parse_assignments(items)
    except DdptopError as exc:
        assert line == f"ddptop: {clean(str(exc), 500)}"  # the value's own message, not a later one
    else:
        assert "--port must be" in line  # good values get as far as the (bad) port


FLAGS = ["--local", "--master", "--rank", "--world-size", "--port", "--strategy", "--bucket-mb", "--async-op",
         "--model", "--dataset", "--batch-size", "--lr", "--epochs", "--steps", "--seed", "--synthetic-size",
         "--threads", "--timeout", "--lost-after", "--collective-timeout", "--token", "--probes", "--span-every",
         "--log-every", "--record", "--record-required", "--profile", "--headless", "--no-eval", "--backend", "--iface",
         "--accum", "--compress", "--lr-warmup-steps", "--", "-x"]
WORDS = st.one_of(st.sampled_from(FLAGS), st.text(max_size=8), st.integers(-10**12, 10**12).map(str),
                  st.floats().map(repr), st.sampled_from(["tiny", "ddp", "smoke", "70000", "nan", "inf", "-1",
                                                          "powersgd:0", "powersgd", "fp16"]))


@FAST
@given(argv=st.lists(WORDS, max_size=8))
def test_any_run_command_line_is_one_line_and_exit_2(argv):
    one_line(*main(*argv, "--port", "0")[::2], {2})


@FAST
@given(command=st.sampled_from(["info", "export", "replay", "report"]), argv=st.lists(WORDS, max_size=5))
def test_any_recording_command_line_is_one_line(tmp_path_factory, command, argv):
    folder = tmp_path_factory.mktemp("cmd")
    cwd = os.getcwd()
    os.chdir(folder)  # whatever a random command line names is created here, if anything
    try:
        code, _, err = main(command, *argv)
    finally:
        os.chdir(cwd)
        shutil.rmtree(folder, ignore_errors=True)
    one_line(code, err, {2, 6})


@pytest.mark.parametrize("argv, words", [
    (["--strategy", "allreduce", "--compress", "powersgd"], "applies only to ddp"),
    (["--strategy", "single", "--compress", "bf16"], "means nothing for single"),
    (["--compress", "powersgd:0"], "powersgd's rank R"), (["--compress", "zip"], "unknown compression"),
    (["--accum", "0"], "accum must be"), (["--lr-warmup-steps", "-1"], "lr_warmup_steps must be")])
def test_accum_and_compress_that_mean_nothing_are_one_line_exit_2(argv, words):
    one_line(*main(*argv, "--steps", "1")[::2], {2}, words)
