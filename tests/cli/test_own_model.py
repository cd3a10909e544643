"""The user's own model, data set and loss (issue 24): two user files train on 2 ranks through all four strategies
(a profile's sweep switches them live), and the recording shows one model on every rank at every segment start;
the built-in bert-mini and a torchvision model run; the recording keeps the spec as text and replay, info, export
and report never import it; ranks whose models differ are refused at the handshake."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import textwrap

import pytest

import ports
from test_run_cli import DDPTOP, assert_one_line_error, ddptop

STRATEGIES = ["single", "gather-scatter", "allreduce", "ddp"]
SWEEP = textwrap.dedent(f"""
    # every strategy in turn, switched live by the sweep
    [sweep]
    warmup = 0
    measure = 6
    configs = [{", ".join(f'{{ strategy = "{s}" }}' for s in STRATEGIES)}]
""")

# An MLP on a synthetic regression set, trained with MSE; `spare` is never used by forward, so it gets no gradient
# (DDP then needs find_unused_parameters, the per-layer strategies send zeros for it).
REGRESSION = textwrap.dedent("""
    import torch
    from torch import nn
    from torch.utils.data import TensorDataset

    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))
            self.spare = nn.Linear(4, 4)

        def forward(self, x):
            return self.body(x)

    def model():
        return MLP()

    def data(seed, size):
        g = torch.Generator().manual_seed(seed)
        x = torch.randn(size, 8, generator=g)
        y = x @ torch.linspace(-1, 1, 8).unsqueeze(1) + 0.05 * torch.randn(size, 1, generator=g)
        return TensorDataset(x, y)
""")

# A GRU over token ids with cross-entropy: the label is which of three marker tokens (0, 1, 2) the sequence holds
# near its end.
TOKENS = textwrap.dedent("""
    import torch
    from torch import nn
    from torch.utils.data import TensorDataset

    class Tagger(nn.Module):
        def __init__(self, num_classes):
            super().__init__()
            self.embed = nn.Embedding(50, 16)
            self.gru = nn.GRU(16, 32, batch_first=True)
            self.head = nn.Linear(32, num_classes)

        def forward(self, ids):
            out, _ = self.gru(self.embed(ids))
            return self.head(out[:, -1])

    def _split(g, count):
        ids = torch.randint(3, 50, (count, 10), generator=g)
        labels = torch.randint(0, 3, (count,), generator=g)
        ids[torch.arange(count), torch.randint(7, 10, (count,), generator=g)] = labels  # in the last three
        return TensorDataset(ids, labels)

    def data(seed, size):
        g = torch.Generator().manual_seed(seed)
        return _split(g, size), _split(g, size // 5)
""")


def _run(folder, name: str, source: str, *flags: str, timeout: float = 300) -> tuple[subprocess.CompletedProcess, str]:
    (folder / f"{name}.py").write_text(source)
    (folder / "sweep.toml").write_text(SWEEP)
    record = str(folder / f"{name}.db")
    result = ddptop("--headless", "--local", "2", "--backend", "gloo", "--record", record, *flags,
                    timeout=timeout, cwd=folder)
    assert result.returncode == 0, result.stderr[-3000:]
    return result, record


@pytest.fixture(scope="module")
def regression(tmp_path_factory):
    folder = tmp_path_factory.mktemp("regression")
    return (folder, *_run(folder, "mine", REGRESSION, "--model", "mine.py:model", "--dataset", "mine.py:data",
                          "--loss", "mse", "--profile", "sweep.toml", "--batch-size", "16", "--lr", "0.05",
                          "--synthetic-size", "512"))


@pytest.fixture(scope="module")
def tokens(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tokens")
    return (folder, *_run(folder, "tagger", TOKENS, "--model", "tagger.py:Tagger", "--dataset", "tagger.py:data",
                          "--profile", "sweep.toml", "--batch-size", "32", "--lr", "0.1", "--synthetic-size", "1024"))


def _segment_prints(record: str) -> dict[int, dict[int, str]]:
    with sqlite3.connect(record) as db:
        rows = db.execute("SELECT json_extract(data, '$.segment'), rank, json_extract(data, '$.fingerprint'), "
                          "json_extract(data, '$.config.strategy') FROM events WHERE kind = 'config_applied'").fetchall()
    out: dict[int, dict[int, str]] = {}
    for segment, rank, fingerprint, strategy in rows:
        out.setdefault(segment, {})[rank] = (fingerprint, strategy)
    return out


def _losses(record: str) -> list[float]:
    with sqlite3.connect(record) as db:
        return [loss for (loss,) in db.execute("SELECT loss FROM steps WHERE rank = 0 ORDER BY step")]


@pytest.mark.parametrize("job", ["regression", "tokens"])
def test_a_users_model_trains_through_every_strategy_as_one_model(job, request):
    _, result, record = request.getfixturevalue(job)
    segments = _segment_prints(record)
    assert [segments[s][0][1] for s in sorted(segments)] == STRATEGIES
    for segment, by_rank in segments.items():
        prints = {fingerprint for fingerprint, _ in by_rank.values()}
        assert sorted(by_rank) == [0, 1] and len(prints) == 1, (segment, by_rank)
    losses = _losses(record)
    assert len(losses) == 6 * len(STRATEGIES)
    first, last = sum(losses[:4]) / 4, sum(losses[-4:]) / 4
    assert last < 0.8 * first, losses
    assert "samples/s" in result.stderr + result.stdout and "img/s" not in result.stderr + result.stdout


def test_the_test_set_line_only_for_classification(regression, tokens):
    assert "Test set:" not in regression[1].stdout + regression[1].stderr  # MSE: no accuracy to speak of
    assert "Test set:" in tokens[1].stdout + tokens[1].stderr


def test_a_recording_keeps_the_spec_as_text_and_nothing_imports_it(regression):
    """After the run, the user's file writes a marker when imported: info, export, replay and report read the
    recording without ever creating it."""
    folder, _, record = regression
    marker = folder / "imported"
    (folder / "mine.py").write_text(f"open({str(marker)!r}, 'w').close()\n" + REGRESSION)
    with sqlite3.connect(record) as db:
        config = json.loads(db.execute("SELECT value FROM meta WHERE key = 'config'").fetchone()[0])
    assert (config["model"], config["dataset"], config["loss"]) == ("mine.py:model", "mine.py:data", "mse")
    for argv in (["info", record], ["export", "--csv", str(folder / "csv"), record],
                 ["replay", "--headless", "--instant", record], ["report", "-o", str(folder / "report"), "--formats", "png", record]):
        result = ddptop(*argv, cwd=folder, timeout=120)
        assert result.returncode == 0, (argv, result.stderr[-2000:])
    assert "mine.py:model" in ddptop("info", record, cwd=folder).stdout
    assert not marker.exists()
    with open(folder / "csv" / "steps.csv") as csv:
        assert "samples" in csv.readline()


def test_the_lectures_models_run_three_steps(tmp_path):
    """bert-mini (on its token set) and a torchvision model, 2 ranks each, both jobs at once (one wait, not two)."""
    jobs = {model: subprocess.Popen(DDPTOP + ["--headless", "--local", "2", "--backend", "gloo", "--model", model,
                                              "--steps", "3", "--batch-size", "4", "--synthetic-size", "64",
                                              "--no-eval", "--no-record"],
                                    cwd=tmp_path, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            for model in ("bert-mini", "torchvision:mobilenet_v3_small")}
    try:
        outs = {model: job.communicate(timeout=300)[0] for model, job in jobs.items()}
    finally:
        for job in jobs.values():
            job.kill()
    for model, job in jobs.items():
        assert job.returncode == 0 and "step 3/3" in outs[model], outs[model][-3000:]
    assert "on tokens" in outs["bert-mini"] and "samples/s" in outs["bert-mini"]
    assert "img/s" in outs["torchvision:mobilenet_v3_small"]


def test_ranks_with_different_models_are_refused_at_the_handshake(tmp_path):
    """One spec, two files: rank 1's MLP is wider (the file reads WIDTH from its environment)."""
    (tmp_path / "mine.py").write_text(REGRESSION.replace("nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1)",
                                                         "nn.Linear(8, W), nn.ReLU(), nn.Linear(W, 1)")
                                      .replace("class MLP", "import os\nW = int(os.environ['WIDTH'])\nclass MLP"))
    port = str(ports.port())
    flags = ["--headless", "--master", "127.0.0.1", "--port", port, "--world-size", "2", "--backend", "gloo",
             "--model", "mine.py:model", "--dataset", "mine.py:data", "--loss", "mse", "--steps", "2",
             "--no-record", "--timeout", "60"]
    ranks = [subprocess.Popen(DDPTOP + flags + ["--rank", str(r)], cwd=tmp_path, text=True, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, env={**os.environ, "WIDTH": str(32 + 8 * r)})
             for r in range(2)]
    try:
        outs = [rank.communicate(timeout=120) for rank in ranks]
    finally:
        for rank in ranks:
            rank.kill()
    for rank, (_, err) in zip(ranks, outs):
        assert rank.returncode == 4, err
        assert "built another model than rank 0" in err and "body.0.weight" in err and "[40, 8]" in err, err


# --- bad user code: one line on stderr and exit 2 (the spec) or 3 (the data), before any rank starts ---

BAD = textwrap.dedent("""
    import torch
    from torch import nn
    from torch.utils.data import TensorDataset

    NOT_CALLABLE = 3

    def mlp():
        return nn.Linear(8, 3)

    def scalar():
        return nn.Linear(8, 1)

    def boom():
        raise ValueError("the model's own words")

    def a_list():
        return [nn.Linear(8, 3)]

    def regression():
        return TensorDataset(torch.randn(16, 8), torch.randn(16))

    def classes():
        return TensorDataset(torch.randn(16, 8), torch.arange(16) % 3)

    def lone_tensors():
        return [torch.randn(8) for _ in range(16)]

    def empty():
        return TensorDataset(torch.randn(0, 8), torch.zeros(0))

    def data_boom():
        raise OSError("no such shard")

    def five():
        return 5

    def names(items):
        return [f"item {i}" for i, _ in enumerate(items)]
""")


@pytest.mark.parametrize("flags, code, words", [
    (["--model", "no_such_module_xyz:make"], 2, ["cannot import no_such_module_xyz", "ModuleNotFoundError"]),
    (["--model", "bad.py:nope"], 2, ["bad.py has no 'nope'"]),
    (["--model", "bad.py:mpl"], 2, ["bad.py has no 'mpl': did you mean 'mlp'?"]),  # a typo: difflib's nearest
    (["--model", "bad.py:NOT_CALLABLE"], 2, ["NOT_CALLABLE is a int, not something to call"]),
    (["--model", "bad.py:boom"], 2, ["raised ValueError: the model's own words"]),
    (["--model", "bad.py:a_list"], 2, ["returned a list", "torch.nn.Module"]),
    (["--model", "bad.py:scalar", "--dataset", "bad.py:regression", "--loss", "mse"], 2,
     ["cannot take the model's output of shape (2, 1)", "targets of shape (2,)", "one shape"]),
    (["--model", "bad.py:scalar", "--dataset", "bad.py:classes"], 2, ["cross-entropy needs (batch, classes ≥ 3)"]),
    (["--model", "bad.py:mlp", "--dataset", "bad.py:lone_tensors"], 3, [  # a batch that is no (inputs, target) pair
        "--loss cross-entropy takes (output, target) from an (inputs, target) batch",
        "this batch is a tensor of shape (2, 8)", "takes (output, batch)"]),
    (["--model", "bad.py:mlp", "--dataset", "bad.py:classes", "--collate", "bad.py:names"], 3, [
        "a batch must hold a tensor whose first dimension counts the samples", "made a list of 2 (str, str)"]),
    (["--model", "bad.py:mlp", "--dataset", "bad.py:classes", "--collate", "bad.py:nope"], 2, ["has no 'nope'"]),
    (["--model", "bad.py:mlp", "--dataset", "bad.py:empty"], 3, ["empty training set"]),
    (["--model", "bad.py:mlp", "--dataset", "bad.py:data_boom"], 3, ["raised OSError: no such shard"]),
    (["--model", "bad.py:mlp", "--dataset", "bad.py:five"], 3, ["returned a int", "map-style Dataset"]),
    (["--model", "bad.py:mlp", "--dataset", "bad.py:classes", "--loss", "bad.py:nope"], 2, ["has no 'nope'"]),
    (["--model", "torchvision:no_such_net"], 2, ["torchvision has no classification model 'no_such_net'"]),
])
def test_bad_user_code_is_one_line_and_an_exit_code(flags, code, words, tmp_path, monkeypatch):
    """In this process (what `ddptop` runs): each case is refused by the front's sample batch, no rank started."""
    from test_bad_input import main, one_line

    (tmp_path / "bad.py").write_text(BAD)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("DDPTOP_DEBUG", raising=False)
    returned, _, err = main("--headless", "--local", "2", "--backend", "gloo", "--no-record", *flags)
    one_line(returned, err, {code}, *words)


def test_debug_shows_the_users_traceback(tmp_path):
    (tmp_path / "bad.py").write_text(BAD)
    result = ddptop("--headless", "--no-record", "--model", "bad.py:boom", cwd=tmp_path,
                    env={"DDPTOP_DEBUG": "1"})
    assert result.returncode != 0 and "Traceback" in result.stderr and "the model's own words" in result.stderr


def test_the_readme_example_builds_with_its_own_loss():
    """ddptop/examples/my_model.py (docs/how-to/own-model.md): its data set's num_classes reaches the model under its own
    loss (no accuracy then), and one sample batch goes through model, loss and backward with every parameter used."""
    from ddptop.config import RunConfig
    from ddptop.train import specs

    example = "ddptop.examples.my_model"  # installed with ddptop: a module spec from any folder
    parts = specs.build(RunConfig(model=f"{example}:model", dataset=f"{example}:data", loss=f"{example}:loss",
                                  synthetic_size=64))
    assert (parts.num_classes, parts.classification, parts.unused) == (4, False, ())
    assert parts.model(parts.train[0][0].unsqueeze(0)).shape == (1, 4) and len(parts.test) == 12
