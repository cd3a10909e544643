"""Batches as users make them (any structure torch's DataLoader and a collate_fn make): how the model and loss are
called on one, its size, and its move to the device.

The rule (README, docs/how-to/own-model.md), one for every batch:
  a pair (inputs, target), a tuple or list of two:  loss(model(inputs), target)
  anything else (a dict, a tensor, a tuple of three, nested):  loss(model(batch), batch)
The batch reaches the model and the loss as the loader made it, its tensors moved to the device.
"""

from __future__ import annotations

from typing import Any

import torch

from ddptop.probes.tensors import leaves


def split(batch: Any) -> tuple[Any, Any]:
    """(what the model gets, what the loss gets after the output) under the rule above."""
    if isinstance(batch, (tuple, list)) and len(batch) == 2:
        return batch[0], batch[1]
    return batch, batch


def size(batch: Any) -> int | None:
    """The number of samples: the first dimension of the batch's first tensor that has one (None: no such tensor)."""
    return next((int(t.shape[0]) for t in leaves(batch) if t.dim() > 0), None)


def describe(value: Any) -> str:
    """A short name of a batch's structure for one-line errors: 'a dict (ids, mask, label)', 'a list of 2 (str,
    str)'."""
    if isinstance(value, torch.Tensor):
        return f"a tensor of shape {tuple(value.shape)}"
    if isinstance(value, dict):
        keys = ", ".join(map(str, list(value)[:6])) + (", …" if len(value) > 6 else "")
        return f"a {type(value).__name__} ({keys})"
    if isinstance(value, (tuple, list)):
        kinds = ", ".join(type(v).__name__ for v in list(value)[:6]) + (", …" if len(value) > 6 else "")
        return f"a {type(value).__name__} of {len(value)} ({kinds})"
    return f"a {type(value).__name__}"


def to_device(batch: Any, device: torch.device, non_blocking: bool = True) -> Any:
    """The batch with every tensor on `device` (non_blocking: from pinned memory the copy overlaps), the structure
    kept: a dict stays the dict's type, a namedtuple its type; anything that is not a tensor passes unchanged."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=non_blocking)
    if isinstance(batch, dict):
        moved = {k: to_device(v, device, non_blocking) for k, v in batch.items()}
        if type(batch) is dict:
            return moved
        try:
            return type(batch)(moved)
        except TypeError:
            return moved
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # a namedtuple
        return type(batch)(*(to_device(v, device, non_blocking) for v in batch))
    if isinstance(batch, (tuple, list)):
        return type(batch)(to_device(v, device, non_blocking) for v in batch)
    return batch
