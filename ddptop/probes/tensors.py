"""Every tensor in a nested value: a batch as the user's collate made it, an optimizer's state entry."""

from __future__ import annotations

from typing import Any, Iterator

import torch


def leaves(value: Any) -> Iterator[torch.Tensor]:
    """Every tensor in `value`: tensors, tuples, lists, dicts (and their subclasses: a namedtuple, a ModelOutput), in
    order. Here rather than in train/batches.py because the probes (below train) read optimizer states with it."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from leaves(item)
    elif isinstance(value, (tuple, list)):
        for item in value:
            yield from leaves(item)
