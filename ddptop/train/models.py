"""Models by name: the course's CIFAR VGG-11, a 32×32 ResNet-18, a tiny CNN for tests, and the lecture's ResNet-50
and BERT-mini."""

from __future__ import annotations

import torch
from torch import nn

from ddptop.errors import UsageError

# The CS744 assignment's VGG-11: 9.23M parameters in 34 tensors (36.9 MB of fp32 gradients per step).
VGG11_CFG = (64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M")


class VGG(nn.Module):
    def __init__(self, cfg=VGG11_CFG, num_classes: int = 10, batch_norm: bool = True):
        super().__init__()
        layers: list[nn.Module] = []
        channels = 3
        for item in cfg:
            if item == "M":
                layers.append(nn.MaxPool2d(kernel_size=2, stride=2))
                continue
            layers.append(nn.Conv2d(channels, item, kernel_size=3, padding=1))
            if batch_norm:
                layers.append(nn.BatchNorm2d(item))
            # not in-place: per-layer backward hooks cannot wrap an output that is later modified in place
            layers.append(nn.ReLU(inplace=False))
            channels = item
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Linear(512, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.features(x), 1))


class TinyCNN(nn.Module):
    """About 21k parameters: fast enough for tests with several ranks on two cores."""

    def __init__(self, num_classes: int = 10, batch_norm: bool = True):
        super().__init__()
        norm = (lambda c: nn.BatchNorm2d(c)) if batch_norm else (lambda c: nn.Identity())
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1), norm(16), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1), norm(32), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(32, 48, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(2),
        )
        self.classifier = nn.Linear(48 * 4, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.features(x), 1))


def _resnet18(num_classes: int = 10) -> nn.Module:
    from torchvision.models import resnet18

    model = resnet18(num_classes=num_classes)
    # CIFAR variant: a 3×3 stem without max-pool keeps 32×32 inputs at a useful resolution
    model.conv1 = nn.Conv2d(3, 64, kernel_size=3, stride=1, padding=1, bias=False)
    model.maxpool = nn.Identity()
    for module in model.modules():
        if isinstance(module, nn.ReLU):
            module.inplace = False
    return model


def _resnet50(num_classes: int = 10) -> nn.Module:
    """torchvision's ResNet-50 as the lecture trains it (weights=None): 23.5M parameters in 161 tensors."""
    from torchvision.models import resnet50

    return not_in_place(resnet50(weights=None, num_classes=num_classes))


def not_in_place(model: nn.Module) -> nn.Module:
    """Every activation out of place (ReLU, Hardswish, ...): the same numbers, and an output that a later layer's
    in-place change cannot take from under the per-layer probe's autograd-node hooks."""
    for module in model.modules():
        if getattr(module, "inplace", None) is True:
            module.inplace = False
    return model


# BERT-mini's shape (Turc et al. 2019: 4 layers, width 256, 4 heads) over BERT's 30522-token vocabulary: 11.0M
# parameters, 7.8M of them (31 MB of fp32 gradient) in the token embedding, one tensor that fills a bucket of its
# own. That gradient is what the lecture's BERT figure is about: small buckets cannot split it.
BERT_VOCAB = 30522
BERT_MINI = {"layers": 4, "width": 256, "heads": 4, "ff": 1024, "max_len": 128}


class EncoderBlock(nn.Module):
    """One pre-norm transformer layer made of Linear and LayerNorm leaves (which the per-layer probe times)."""

    def __init__(self, width: int, heads: int, ff: int):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.up, self.act, self.down = nn.Linear(width, ff), nn.GELU(), nn.Linear(ff, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, w = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, self.heads, w // self.heads).permute(2, 0, 3, 1, 4)
        attended = nn.functional.scaled_dot_product_attention(q, k, v)
        x = x + self.proj(attended.transpose(1, 2).reshape(b, t, w))
        return x + self.down(self.act(self.up(self.norm2(x))))


class BertMini(nn.Module):
    """Token ids (batch, length) → class scores: embeddings, encoder blocks, mean over positions, a linear head."""

    def __init__(self, num_classes: int = 2, vocab: int = BERT_VOCAB, layers: int = 4, width: int = 256,
                 heads: int = 4, ff: int = 1024, max_len: int = 128):
        super().__init__()
        self.tokens, self.positions = nn.Embedding(vocab, width), nn.Embedding(max_len, width)
        self.blocks = nn.Sequential(*(EncoderBlock(width, heads, ff) for _ in range(layers)))
        self.norm, self.head = nn.LayerNorm(width), nn.Linear(width, num_classes)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.tokens(ids) + self.positions(torch.arange(ids.shape[1], device=ids.device))
        return self.head(self.norm(self.blocks(x)).mean(dim=1))


class SleepBefore(nn.Module):
    """Test-only: sleeps a known time before the wrapped model's forward, so tests can check that an injected
    delay shows up as compute (and nowhere else). Chosen only by testhooks.model_tweaks (sleep-ms=N)."""

    def __init__(self, model: nn.Module, seconds: float):
        super().__init__()
        self.model = model
        self.seconds = seconds

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        import time

        time.sleep(self.seconds)
        return self.model(x)


class OutOfMemoryAt(nn.Module):
    """Test-only: raises torch.cuda.OutOfMemoryError in forward for batches of `batch` or more, as CUDA would
    for a batch that does not fit, so the roll-back can be tested on CPU. Chosen only by testhooks.model_tweaks (oom-batch=N)."""

    def __init__(self, model: nn.Module, batch: int):
        super().__init__()
        self.model = model
        self.batch = batch

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] >= self.batch:
            raise torch.cuda.OutOfMemoryError(f"CUDA out of memory (test hook: batch {x.shape[0]} >= {self.batch})")
        return self.model(x)


def build_model(name: str, batch_norm: bool = True, sleep_s: float = 0.0, oom_batch: int = 0,
                num_classes: int = 10) -> nn.Module:
    """A freshly initialized built-in model; call after seeding so every rank starts from the same weights."""
    if name == "vgg11":
        model: nn.Module = VGG(batch_norm=batch_norm, num_classes=num_classes)
    elif name == "tiny":
        model = TinyCNN(batch_norm=batch_norm, num_classes=num_classes)
    elif name == "resnet18":
        model = _resnet18(num_classes)
    elif name == "resnet50":
        model = _resnet50(num_classes)
    elif name == "bert-mini":
        model = BertMini(num_classes, **BERT_MINI)
    else:
        raise UsageError(f"unknown model {name!r}: choose one of vgg11, resnet18, tiny, resnet50, bert-mini")
    model = SleepBefore(model, sleep_s) if sleep_s > 0 else model
    return OutOfMemoryAt(model, oom_batch) if oom_batch > 0 else model


def layer_param_counts(model: nn.Module) -> tuple[tuple[str, int], ...]:
    """(module name, trained parameters it holds itself), for every module that holds any, in the order
    `model.parameters()` lists them (DDP buckets them in the reverse). Not only leaf layers: attention's
    in-projection (`in_proj_weight` on nn.MultiheadAttention, whose `out_proj` is a child) and a bare nn.Parameter
    on any module count where they live; a tied weight counts once, at its first owner; the model's own parameters
    are named "(model)". The counts add up to the trained parameters, as RunStarted's param_count (issue 44)."""
    seen: set[int] = set()
    out = []
    for name, module in model.named_modules():
        count = 0
        for p in module.parameters(recurse=False):
            if id(p) not in seen and p.requires_grad:
                seen.add(id(p))
                count += p.numel()
        if count:
            out.append((name or "(model)", count))
    return tuple(out)
