"""Batches as users make them (any structure torch's DataLoader and a collate_fn make): how the model and loss are
called on one, its size, its tokens, and its move to the device.

The rule (README, docs/how-to/own-model.md), one for every batch:
  a pair (inputs, target), a tuple or list of two:  loss(model(inputs), target)
  anything else (a dict, a tensor, a tuple of three, nested):  loss(model(batch), batch)
The batch reaches the model and the loss as the loader made it, its tensors moved to the device.
"""

from __future__ import annotations

import operator
from typing import Any, Callable

import torch

from ddptop.errors import DataError
from ddptop.probes.tensors import leaves


def split(batch: Any) -> tuple[Any, Any]:
    """(what the model gets, what the loss gets after the output) under the rule above."""
    if isinstance(batch, (tuple, list)) and len(batch) == 2:
        return batch[0], batch[1]
    return batch, batch


def size(batch: Any) -> int | None:
    """The number of samples: the first dimension of the batch's first tensor that has one (None: no such tensor)."""
    return next((int(t.shape[0]) for t in leaves(batch) if t.dim() > 0), None)


TOKEN_MASK = "attention_mask"  # Hugging Face's name: 1 (or True) at each real token, 0 at padding


def tokens(batch: Any, count: Callable[[Any], Any] | None = None) -> int:
    """The tokens a batch holds, as it says (0: it does not say): the user's own `count(batch)` (--tokens, a
    profile's `tokens`) where given, else a dict batch's `attention_mask` summed. No other mask is read: torch's
    src_key_padding_mask is True at padding, the opposite, so a guess by a key like `mask` would count the pads.
    Counted on the batch as the loader made it (on the host: no wait for the device)."""
    if count is not None:
        value = count(batch)
        return whole_tokens(value, "--tokens")
    mask = batch.get(TOKEN_MASK) if isinstance(batch, dict) else None
    if isinstance(mask, torch.Tensor) and not mask.is_floating_point() and not mask.is_complex():
        return int(torch.count_nonzero(mask))
    return 0


def whole_tokens(value: Any, who: str) -> int:
    """A token count as a plain int (a number, a one-element integer tensor, a numpy integer), or one DataError
    line naming `who` gave it."""
    if isinstance(value, torch.Tensor) and value.numel() == 1 and not value.is_floating_point():
        value = value.item()
    try:
        if isinstance(value, bool):
            raise TypeError
        value = operator.index(value)
    except TypeError:
        raise DataError(f"{who} must give a whole number of tokens ≥ 0, got {describe(value)}") from None
    if value < 0:
        raise DataError(f"{who} must give a whole number of tokens ≥ 0, got {value}")
    return value


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
