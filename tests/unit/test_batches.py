"""Batches as users make them (issue 44): the one rule for how the model and loss are called, the batch size and the
move to the device for any structure a collate_fn makes, and the spec check's sample batch on dict items, (dict,
label) items and the user's own collate_fn, with one line for what fits no rule."""

from __future__ import annotations

from collections import namedtuple

import pytest
import torch
from torch import nn

from ddptop.config import RunConfig
from ddptop.errors import DataError, UsageError
from ddptop.train import batches, specs
from ddptop.train.models import layer_param_counts

EXAMPLE = "ddptop.examples.transformer"
Pair = namedtuple("Pair", "x y")


def test_a_pair_is_inputs_and_target_and_anything_else_goes_whole_to_model_and_loss():
    x, y = torch.zeros(3, 2), torch.ones(3)
    assert batches.split((x, y))[0] is x and batches.split([x, y])[1] is y
    for whole in ({"ids": x, "label": y}, x, (x, y, y), [x]):
        inputs, target = batches.split(whole)
        assert inputs is whole and target is whole


@pytest.mark.parametrize("batch, size", [
    (torch.zeros(5, 3), 5),
    ({"ids": torch.zeros(7, 11, dtype=torch.long), "mask": torch.zeros(7, 11, dtype=torch.bool)}, 7),
    ((torch.tensor(2.0), {"a": [torch.zeros(4, 2)]}), 4),  # a 0-d tensor counts nothing: the next one does
    (Pair(torch.zeros(6), torch.zeros(6)), 6),
    (["text", 3], None),
])
def test_the_batch_size_is_the_first_dimension_of_the_first_tensor_that_has_one(batch, size):
    assert batches.size(batch) == size


def test_every_tensor_moves_and_the_structure_stays():
    batch = {"ids": torch.zeros(2, 3), "nested": (torch.ones(2), [torch.ones(2, 1), "name"]),
             "pair": Pair(1, torch.ones(1))}
    moved = batches.to_device(batch, torch.device("meta"))
    assert list(moved) == ["ids", "nested", "pair"] and isinstance(moved["pair"], Pair)
    assert [t.device.type for t in batches.leaves(moved)] == ["meta"] * 4
    assert moved["nested"][1][1] == "name" and moved["pair"].x == 1 and isinstance(moved["nested"], tuple)
    assert [t.device.type for t in batches.leaves(batch)] == ["cpu"] * 4  # the loader's batch is left as it was


def test_the_example_transformer_builds_with_dict_items_its_collate_and_its_loss():
    """Variable-length dict items, padded by the user's collate_fn into {"ids", "mask", "label"}: the spec check
    runs model and loss on it, every parameter (attention's in-projection included) gets a gradient, and the
    per-layer counts hold every trained byte."""
    cfg = RunConfig(model=f"{EXAMPLE}:model", dataset=f"{EXAMPLE}:data", collate=f"{EXAMPLE}:collate",
                    loss=f"{EXAMPLE}:loss", synthetic_size=64)
    parts = specs.build(cfg)
    assert parts.unused == () and parts.num_classes == 4 and parts.collate is not None
    items = [parts.train[i] for i in range(6)]
    assert len({len(item["ids"]) for item in items}) > 1  # the items really vary in length
    batch = parts.collate(items)
    assert set(batch) == {"ids", "mask", "label"} and batch["ids"].shape[1] == max(len(i["ids"]) for i in items)
    assert batches.size(batch) == 6 and parts.model(batch).shape == (6, 4)
    trained = [p for p in parts.model.parameters() if p.requires_grad]
    assert sum(c for _, c in layer_param_counts(parts.model)) * 4 == \
        sum(p.numel() * p.element_size() for p in trained)


class DictItems(torch.utils.data.Dataset):
    """Items a dict, or (dict, label): what default_collate batches without any collate_fn of the user's."""

    def __init__(self, paired: bool):
        self.paired = paired

    def __len__(self):
        return 8

    def __getitem__(self, i):
        item = {"x": torch.full((3,), float(i)), "scale": torch.tensor(2.0)}
        return (item, i % 2) if self.paired else {**item, "y": torch.tensor(float(i))}


class DictModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 2)

    def forward(self, batch):
        return self.lin(batch["x"] * batch["scale"].unsqueeze(1))


def _parts(train, loss, collate=None):
    return specs.Parts(DictModel(), train, None, loss, False, None, collate=collate)


def test_dict_items_and_dict_label_items_reach_model_and_loss_as_torch_batches_them():
    seen = []

    def whole(output, batch):  # a dict batch: the loss gets (output, batch)
        seen.append(sorted(batch))
        return (output.sum(1) - batch["y"]).pow(2).mean()

    def paired(output, target):  # (dict, label): loss(model(inputs), target)
        seen.append(tuple(target.shape))
        return nn.functional.cross_entropy(output, target)

    cfg = RunConfig(model="x.py:m", dataset="x.py:d", loss="x.py:l")
    assert specs.try_batch(_parts(DictItems(False), whole), cfg) == ()
    assert specs.try_batch(_parts(DictItems(True), paired), cfg) == ()
    assert seen == [["scale", "x", "y"], (2,)]


def test_a_built_in_loss_on_a_batch_that_is_no_pair_is_one_line():
    cfg = RunConfig(model="x.py:m", dataset="x.py:d", loss="cross-entropy")
    with pytest.raises(DataError) as caught:
        specs.try_batch(_parts(DictItems(False), nn.CrossEntropyLoss()), cfg)
    text = str(caught.value)
    assert "\n" not in text and "a dict (x, scale, y)" in text and "(output, batch)" in text, text


def test_a_collate_whose_batch_holds_no_tensor_is_one_line_naming_what_it_made():
    def names(items):
        return [f"item {i}" for i, _ in enumerate(items)]

    with pytest.raises(DataError) as caught:
        specs.sample_batch(DictItems(False), "x.py:d", names)
    text = str(caught.value)
    assert "\n" not in text and "--collate names made a list of 2 (str, str)" in text, text
    with pytest.raises(DataError) as caught:
        specs.sample_batch(DictItems(False), "x.py:d", lambda items: 1 / 0)
    assert "do not make a batch" in str(caught.value) and "ZeroDivisionError" in str(caught.value)


def test_a_collate_spec_is_checked_like_the_others():
    with pytest.raises(UsageError, match="--collate 'pad'"):
        RunConfig(collate="pad")
    with pytest.raises(UsageError, match="has no 'nope'"):
        specs.build(RunConfig(model=f"{EXAMPLE}:model", dataset=f"{EXAMPLE}:data", collate=f"{EXAMPLE}:nope",
                              loss=f"{EXAMPLE}:loss", synthetic_size=16))


def test_the_unused_warning_names_a_few_and_counts_the_rest():
    line = specs.unused_note(tuple(f"p{i}" for i in range(7)))
    assert "7 parameters got no gradient" in line and "(p0, p1, p2, p3 and 3 more)" in line
    assert "find_unused_parameters=True" in line and "send zeros" in line and "\n" not in line


def test_a_collate_of_yours_is_checked_with_ddptops_own_model_and_data_too(tmp_path, monkeypatch):
    (tmp_path / "mine.py").write_text("def names(items):\n    return ['a' for _ in items]\n")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(DataError, match="made a list of 2 \\(str, str\\)"):
        specs.build(RunConfig(model="tiny", dataset="synthetic", collate="mine.py:names", synthetic_size=64))
