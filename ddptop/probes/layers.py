"""Per-layer forward and backward spans from module and autograd-node hooks, attached only for sampled steps."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ddptop.probes.own import OwnTime, now


def leaf_layers(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """(name, module) of every module without children, named as users see them (`features.0`)."""
    return [(name, m) for name, m in model.named_modules() if name and not any(True for _ in m.children())]


class LayerProbe:
    """Stamps the start and end of every leaf layer's forward and backward.

    Forward: module pre/post hooks. Backward: hooks on the autograd node that produced the layer's output
    (a leaf layer is one node: ConvolutionBackward, NativeBatchNormBackward, ...), registered in the forward
    hook. Unlike `register_full_backward_hook`, this wraps nothing, so models that modify a layer's output in
    place (torchvision ResNet's `out += identity` after a BatchNorm) train unchanged. Hooks are attached for a
    sampled step and removed after it, so other steps pay nothing; the time the hooks themselves take is
    ddptop's own cost (`own`).
    """

    def __init__(self, model: nn.Module, clock: Any, own: OwnTime | None = None):
        self.model = model
        # listed once, when the strategy is built (StepProbe.watch): walking the module tree again on every sampled
        # step cost time inside that step (a model's structure does not change within a build)
        self.leaves = leaf_layers(model)
        self.clock = clock
        self.own = own or OwnTime()
        self._handles: list = []
        self.marks: list[tuple[str, str, Any, Any]] = []  # (kind, layer, start mark, end mark)
        self._open: dict[str, Any] = {}

    def attach(self) -> None:
        if self._handles:
            return
        began = now()
        self.marks, self._open = [], {}
        for name, module in self.leaves:
            self._handles += [module.register_forward_pre_hook(self._fwd_start(name)),
                              module.register_forward_hook(self._fwd_end(name))]
        self.own.since(began)

    def detach(self) -> list[tuple[str, str, Any, Any]]:
        began = now()
        for handle in self._handles:
            handle.remove()
        self._handles = []
        self.own.since(began)
        return self.marks

    def _fwd_start(self, name: str):
        def hook(_module, _inputs):
            began = now()
            self._open[name] = self.clock.now()
            self.own.since(began)

        return hook

    def _fwd_end(self, name: str):
        def hook(_module, inputs, output):
            began = now()
            start = self._open.pop(name, None)
            if start is not None:
                self.marks.append(("fwd", name, start, self.clock.now()))
            # nn.Identity hands its input through: that node is the previous layer's
            node = None if inputs and output is inputs[0] else _grad_node(output)
            if node is not None:
                opened: list = []
                node.register_prehook(self._bwd_start(opened))
                node.register_hook(self._bwd_end(name, opened))
            self.own.since(began)

        return hook

    def _bwd_start(self, opened: list):
        def hook(_grad_outputs):
            began = now()
            opened.append(self.clock.now())
            self.own.since(began)

        return hook

    def _bwd_end(self, name: str, opened: list):
        def hook(_grad_inputs, _grad_outputs):
            began = now()
            if opened:
                self.marks.append(("bwd", name, opened.pop(), self.clock.now()))
            self.own.since(began)

        return hook


def _grad_node(output: Any):
    """The autograd node that produced a layer's (first) output tensor, if it takes part in backward."""
    if isinstance(output, (tuple, list)):
        output = next((o for o in output if isinstance(o, torch.Tensor)), None)
    if isinstance(output, torch.Tensor) and output.grad_fn is not None:
        return output.grad_fn
    return None
