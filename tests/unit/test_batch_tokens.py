"""train/batches.tokens: what a batch says of its tokens (issue 44). Truth: counts made here from the batch's own
lengths, never by the function under test."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ddptop.errors import DataError
from ddptop.train import batches

LENGTHS = [3, 7, 1, 5]


def padded(lengths=LENGTHS) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, attention_mask): Hugging Face's 1 at real tokens, 0 at padding."""
    ids = torch.zeros(len(lengths), max(lengths), dtype=torch.long)
    for row, n in enumerate(lengths):
        ids[row, :n] = torch.arange(1, n + 1)
    return ids, (ids != 0).long()


def test_a_dict_batchs_attention_mask_is_summed_integer_or_bool():
    ids, mask = padded()
    assert batches.tokens({"input_ids": ids, "attention_mask": mask}) == sum(LENGTHS) == 16
    assert batches.tokens({"input_ids": ids, "attention_mask": mask.bool()}) == 16


@pytest.mark.parametrize("batch", [
    {"ids": padded()[0], "mask": padded()[1] == 0},  # torch's src_key_padding_mask: True at padding, not guessed
    {"input_ids": padded()[0], "attention_mask": padded()[1].float()},  # additive float masks: not a count
    (padded()[0], torch.tensor(LENGTHS)),  # a pair
    padded()[0],
], ids=["a padding mask", "a float mask", "a pair", "a tensor"])
def test_a_batch_that_does_not_say_its_tokens_counts_none(batch):
    assert batches.tokens(batch) == 0


def test_the_users_count_wins_and_may_be_a_tensor_or_a_numpy_integer():
    ids, mask = padded()
    batch = {"ids": ids, "mask": mask == 0, "attention_mask": torch.ones_like(mask)}
    assert batches.tokens(batch, lambda b: int((~b["mask"]).sum())) == 16
    assert batches.tokens(batch, lambda b: (~b["mask"]).sum()) == 16
    assert batches.tokens(batch, lambda b: np.int64(16)) == 16


@pytest.mark.parametrize("value", [1.5, -1, True, "16", torch.tensor([1, 2]), None])
def test_a_count_that_is_no_whole_number_is_one_data_error(value):
    with pytest.raises(DataError, match="--tokens must give a whole number of tokens ≥ 0"):
        batches.tokens({}, lambda b: value)
