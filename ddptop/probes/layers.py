"""Per-layer forward and backward spans from module hooks, attached only for sampled steps."""

from __future__ import annotations

import warnings
from typing import Any

from torch import nn

from ddptop.train.models import leaf_layers

# The first layer's input needs no gradient, so torch fires its backward hook on output gradients and warns
# about it every step; that is exactly the span we want.
warnings.filterwarnings("ignore", message="Full backward hook is firing when gradients are computed with respect")


class LayerProbe:
    """Stamps the start and end of every leaf layer's forward and backward.

    Hooks are attached for a sampled step and removed after it, so unsampled steps pay nothing:
    full backward hooks wrap every layer's output in an extra autograd node.
    """

    def __init__(self, model: nn.Module, clock: Any):
        self.model = model
        self.clock = clock
        self._handles: list = []
        self.marks: list[tuple[str, str, Any, Any]] = []  # (kind, layer, start mark, end mark)
        self._open: dict[tuple[str, str], Any] = {}

    def attach(self) -> None:
        if self._handles:
            return
        self.marks, self._open = [], {}
        for name, module in leaf_layers(self.model):
            self._handles += [
                module.register_forward_pre_hook(self._opener("fwd", name)),
                module.register_forward_hook(self._closer("fwd", name)),
                module.register_full_backward_pre_hook(self._opener("bwd", name)),
                module.register_full_backward_hook(self._closer("bwd", name)),
            ]

    def detach(self) -> list[tuple[str, str, Any, Any]]:
        for handle in self._handles:
            handle.remove()
        self._handles = []
        return self.marks

    def _opener(self, kind: str, name: str):
        def hook(*_args):
            self._open[(kind, name)] = self.clock.now()

        return hook

    def _closer(self, kind: str, name: str):
        def hook(*_args):
            start = self._open.pop((kind, name), None)
            if start is not None:
                self.marks.append((kind, name, start, self.clock.now()))

        return hook
