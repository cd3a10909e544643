"""Your own model, data set and loss for ddptop: copy this file, change the three parts, keep the three names.

    ddptop --model ddptop.examples.my_model:model --dataset ddptop.examples.my_model:data --loss ddptop.examples.my_model:loss

(ddptop's copy, from any folder), or your copy by its path: `--model my_model.py:model` and so on.

and, from another terminal while it trains, `ddptop ctl set strategy=allreduce` (docs/how-to/own-model.md).
"""

import torch
from torch import nn
from torch.utils.data import Dataset

FEATURES = 16


class Tabular(Dataset):
    """Rows of FEATURES floats; the class is the quadrant of two hidden directions (4 classes), so a linear model
    cannot learn it and an MLP can. Items are (input, target): what ddptop needs from a data set."""

    num_classes = 4  # ddptop passes it to model(num_classes=...) (without it ddptop reads the targets to count)

    def __init__(self, size: int, generator: torch.Generator, directions: torch.Tensor):
        self.rows = torch.randn(size, FEATURES, generator=generator)
        above = (self.rows @ directions > 0).long()
        self.labels = above[:, 0] * 2 + above[:, 1]

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int):
        return self.rows[index], int(self.labels[index])


def data(seed: int = 0, size: int = 12800):
    """ddptop calls it with seed (--seed) and size (--synthetic-size); a (train, test) pair gives the test-set
    line, a training set alone does not. Every rank calls it: it must give every rank the same items."""
    generator = torch.Generator().manual_seed(seed)
    directions = torch.randn(FEATURES, 2, generator=generator)
    return Tabular(size, generator, directions), Tabular(max(1, size // 5), generator, directions)


class MLP(nn.Module):
    def __init__(self, num_classes: int):
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(FEATURES, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
                                    nn.Linear(64, num_classes))

    def forward(self, rows: torch.Tensor) -> torch.Tensor:
        return self.layers(rows)


def model(num_classes: int) -> nn.Module:
    """ddptop seeds torch first (--seed), so every rank builds the same weights."""
    return MLP(num_classes)


def loss(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Any (outputs, targets) → scalar tensor. Only `--loss cross-entropy` gets accuracy and the test-set line."""
    return nn.functional.cross_entropy(outputs, targets, label_smoothing=0.1)
