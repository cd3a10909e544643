"""Keeping every rank's model identical: the model fingerprint and re-synchronizing from rank 0 at a switch."""

from __future__ import annotations

import hashlib

import torch
import torch.distributed as dist
from torch import nn


def fingerprint(model) -> str:
    """SHA-256 over the raw bytes of every parameter, in `named_parameters()` order (names and shapes not
    included; the machine's byte order, little-endian on x86 and ARM). Equal fingerprints: bitwise equal
    parameters. VGG-11's 36.9 MB hash in about 60 ms on one core here. `model`: a module, or (name, full
    tensor) pairs in that order (a sharded strategy's gathered parameters, Strategy.full_parameters)."""
    digest = hashlib.sha256()
    pairs = model.named_parameters() if isinstance(model, nn.Module) else model
    for _name, param in pairs:
        data = param.detach()
        if data.device.type != "cpu":
            data = data.cpu()
        digest.update(data.contiguous().reshape(-1).view(torch.uint8).numpy())
    return digest.hexdigest()


def state_tensors(model: nn.Module, optimizer: torch.optim.Optimizer, with_model: bool) -> list[torch.Tensor]:
    """What makes a rank's training state: parameters and buffers (BatchNorm statistics), and the optimizer's
    per-parameter state (SGD's momentum buffers), in an order every rank agrees on."""
    tensors = [*model.parameters(), *model.buffers()] if with_model else []
    for group in optimizer.param_groups:
        for param in group["params"]:
            state = optimizer.state.get(param, {})
            tensors += [state[key] for key in sorted(state) if isinstance(state[key], torch.Tensor)]
    return tensors


def broadcast_state(model: nn.Module, optimizer: torch.optim.Optimizer, with_model: bool = True) -> int:
    """Make every rank's state rank 0's; returns the bytes rank 0 broadcast.

    Needed when a segment that synchronizes gradients follows `single`, under which every rank trained alone
    and drifted apart: averaging gradients over N different models would train N different models. DDP
    broadcasts parameters and buffers itself when it is built (`with_model=False` then), not the momentum."""
    nbytes = 0
    with torch.no_grad():
        for tensor in state_tensors(model, optimizer, with_model):
            dist.broadcast(tensor.data, src=0)
            nbytes += tensor.numel() * tensor.element_size()
    return nbytes


def model_bytes(model: nn.Module) -> int:
    """Bytes of parameters and buffers: what DDP broadcasts from rank 0 each time it is built."""
    return sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])
