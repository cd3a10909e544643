"""How hard the synthetic data set is: the tiny CNN trained in one process on it, loss and test accuracy by step.

    .venv/bin/python benchmarks/synthetic_difficulty.py [--steps 600] [--lr 0.05] [--size 6400]
    .venv/bin/python benchmarks/synthetic_difficulty.py --model vgg11 --momentum 0.9 --batch-size 256 --seed 14 \
        --steps 24 --lr 0.1      (the cs744 profiles' optimizer: does VGG-11 learn at this lr?)

Prints, at steps 10, 200 and the last, the mean training loss of the last 20 steps (first 20 for reference), the
lowest single-batch loss and the accuracy on the clean test split. (VGG-11's figure after one epoch comes from a
real run: `ddptop --headless --local 2 --model vgg11 --epochs 1 --seed 14`, its `Test set:` line.)
"""

from __future__ import annotations

import argparse
import statistics

import torch
import torch.nn.functional as F

from ddptop.train import data
from ddptop.train.models import build_model


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--size", type=int, default=6400)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--model", default="tiny")
    p.add_argument("--momentum", type=float, default=0.0, help="0.9 (and weight decay 1e-4) is the trainer's")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    torch.set_num_threads(1)
    train, test = data.synthetic_datasets(args.seed, args.size)
    torch.manual_seed(args.seed)
    model = build_model(args.model)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum,
                                weight_decay=1e-4 if args.momentum else 0.0)
    loader, sampler = data.make_loader(train, args.batch_size, 0, 1, args.seed, True)
    losses: list[float] = []
    epoch = 0
    while len(losses) < args.steps:
        sampler.set_epoch(epoch)
        epoch += 1
        for images, labels in loader:
            model.train()
            loss = F.cross_entropy(model(images), labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
            if len(losses) in (10, 200, args.steps):
                print(_line(model, losses, test), flush=True)
            if len(losses) >= args.steps:
                break


def _line(model, losses: list[float], test) -> str:
    model.eval()
    with torch.no_grad():
        images, labels = test.tensors
        accuracy = (model(images).argmax(1) == labels).float().mean().item()
    return (f"step {len(losses)}: loss {statistics.fmean(losses[-20:]):.2f} (last 20 steps; first 20: "
            f"{statistics.fmean(losses[:20]):.2f}), lowest batch {min(losses):.2f}, test accuracy {accuracy:.0%}")


if __name__ == "__main__":
    main()
