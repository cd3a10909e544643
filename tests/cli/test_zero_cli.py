"""ZeRO stages from the command line (issue 43): `--strategy zero2 --accum 2` trains the built-in tiny model and a
`--model file.py:fn` model on 2 local ranks, every rank one model (fingerprints in the recording, taken on the
full, gathered parameters), with FSDP2's units each top-level block and their bytes per step by formula
(K·(N−1)/N·S for the all-gathers plus gloo's reduce-scatter, an all-reduce: 2(N−1)/N·S; S computed here from a
model built in the test; tests/lab/test_zero_lab.py holds these against the NICs' own counters); bad input is one line and exit 2."""

from __future__ import annotations

import importlib.util
import json
import sqlite3
import sys
import textwrap

import pytest

from ddptop.errors import UsageError
from test_bad_input import main, one_line
from test_run_cli import TINY, ddptop

MINE = textwrap.dedent("""
    from torch import nn

    class Net(nn.Module):
        def __init__(self, num_classes):
            super().__init__()
            self.stem = nn.Sequential(nn.Flatten(), nn.Linear(3 * 32 * 32, 24), nn.ReLU())
            self.body = nn.Sequential(nn.Linear(24, 24), nn.ReLU(), nn.Linear(24, 24), nn.ReLU())
            self.act = nn.ReLU()  # holds no parameters: not a unit of its own
            self.head = nn.Linear(24, num_classes)

        def forward(self, x):
            return self.head(self.act(self.body(self.stem(x))))

    def net(num_classes):
        return Net(num_classes)
""")
STEPS, WORLD, ACCUM = 4, 2, 2


def _recorded(record: str):
    with sqlite3.connect(record) as db:
        events = [(kind, rank, json.loads(data)) for kind, rank, data in
                  db.execute("SELECT kind, rank, data FROM events ORDER BY seq")]
        steps = db.execute("SELECT rank, step, tx_bytes, rx_bytes FROM steps").fetchall()
        spans = {span[1] for (text,) in db.execute("SELECT spans FROM spans") for span in json.loads(text)
                 if span[0] == "comm"}
    return events, steps, spans


def _param_bytes(model) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


def _mine(folder):
    spec = importlib.util.spec_from_file_location("mine_zero", folder / "mine.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.net(10)


@pytest.mark.parametrize("which", ["tiny", "mine"])
def test_zero2_with_accumulation_trains_one_model_on_every_rank(which, tmp_path):
    (tmp_path / "mine.py").write_text(MINE)
    record = str(tmp_path / "run.db")
    model_flags = ["--model", "mine.py:net"] if which == "mine" else []
    result = ddptop(*TINY, *model_flags, "--local", str(WORLD), "--steps", str(STEPS), "--strategy", "zero2",
                    "--accum", str(ACCUM), "--batch-size", "8", "--threads", "1", "--span-every", "1",
                    "--record", record, timeout=240, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    events, steps, spans = _recorded(record)
    applied = {rank: data for kind, rank, data in events if kind == "config_applied"}
    assert sorted(applied) == [0, 1] and {d["config"]["strategy"] for d in applied.values()} == {"zero2"}
    assert {d["config"]["accum"] for d in applied.values()} == {ACCUM}
    assert len({d["fingerprint"] for d in applied.values()}) == 1
    finished = {rank: data["fingerprint"] for kind, rank, data in events if kind == "run_finished"}
    assert sorted(finished) == [0, 1] and len(set(finished.values())) == 1
    assert set(finished.values()) != {d["fingerprint"] for d in applied.values()}  # it trained
    if which == "mine":
        size = _param_bytes(_mine(tmp_path))
        # the default units: each top-level block holding parameters (stem, body, head; not act), then the root
        # each a span of its own (zero2: one gather per micro-step, "(2)" the second; one reduce-scatter)
        assert spans == {f"{what} {unit}" for what in ("all-gather", "reduce-scatter") for unit in ("stem", "body",
                                                                                                    "head")} | {
            f"all-gather {unit} ({ACCUM})" for unit in ("stem", "body", "head")}
    else:
        from ddptop.train.models import build_model

        size = _param_bytes(build_model("tiny"))
    share = (WORLD - 1) * size // WORLD  # each way, per all-gather of the whole model
    reduce_scatter = 2 * (WORLD - 1) * size // WORLD  # gloo runs a reduce-scatter as an all-reduce (the lab's NICs)
    assert len(steps) == WORLD * STEPS
    assert {(tx, rx) for _, _, tx, rx in steps} == {(ACCUM * share + reduce_scatter, ACCUM * share + reduce_scatter)}
    # info's hint names accumulation that saves little communication, with the bytes per step and per micro-step
    # (the steps table's, SQL above; local ranks share one interface: the formulas' bytes)
    info = ddptop("info", record, cwd=tmp_path)
    sent = ACCUM * share + reduce_scatter
    line = next(x for x in info.stdout.splitlines() if "saves little communication" in x)
    assert (f"accum {ACCUM} under zero2 saves little communication: rank 0 sent {sent / 1e6:.3g} MB a step, "
            f"{sent / ACCUM / 1e6:.3g} MB each micro-step") in line, line


@pytest.mark.parametrize("flags, words", [
    (["--strategy", "zero4"], ["invalid choice: 'zero4'", "'zero1', 'zero2', 'zero3'"]),
    (["--strategy", "zero3", "--shard-unit", "NoSuchBlock"], ["shard unit 'NoSuchBlock' names no module",
                                                              "top-level blocks: features, classifier"]),
    (["--strategy", "zero2", "--shard-unit", "features.99"], ["shard unit 'features.99' names no module"]),
    (["--strategy", "ddp", "--shard-unit", "Linear"], ["--shard-unit applies only to zero2 and zero3"]),
    (["--strategy", "zero3", "--shard-unit", "a b"], ["shard_unit must be"]),
    (["--strategy", "zero1", "--compress", "fp16"], ["compress=fp16 applies to", "not to zero1"]),
])
def test_bad_zero_input_is_one_line_and_exit_2(flags, words, monkeypatch):
    monkeypatch.delenv("DDPTOP_DEBUG", raising=False)
    returned, _, err = main(*TINY, "--local", "2", "--steps", "2", "--no-record", *flags)
    one_line(returned, err, {2}, *words)


def test_an_own_loop_refuses_the_zero_strategies_in_one_line(monkeypatch):
    from ddptop import api

    monkeypatch.setattr(sys, "excepthook", sys.excepthook)  # join installs its own
    with pytest.raises(UsageError, match="an own loop keeps its own optimizer") as caught:
        api.join(strategy="zero3")
    assert "\n" not in str(caught.value) and caught.value.exit_code == 2
