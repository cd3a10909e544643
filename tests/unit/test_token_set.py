"""bert-mini's token set: every label is the marker token that occurs most (counted here, not by data.py), and a
model learns it: a bag of embeddings reaches 90% test accuracy in 100 steps."""

from __future__ import annotations

import torch
from torch import nn

from ddptop.train import data


def test_every_label_is_the_marker_that_occurs_most():
    train, test = data.token_datasets(seed=3, size=2000)
    ids, labels = train.tensors
    assert ids.shape == (2000, data.TOKEN_LENGTH) and len(test) == 400 and ids.max() < data.TOKEN_VOCAB
    values, counts = torch.unique(ids, return_counts=True)
    per_class = values[counts.topk(data.TOKEN_CLASSES).indices].tolist()  # ~1 a row each; other tokens ~2 in all
    assert counts.topk(data.TOKEN_CLASSES + 1).values[-1] < 50
    hits = torch.stack([(ids == m).sum(dim=1) for m in per_class], dim=1)  # (rows, markers)
    assert sorted(hits.max(dim=1).values.unique().tolist()) == [data.TOKEN_MARKS]
    order = {int(label): int(hits[labels == label].float().mean(0).argmax()) for label in labels.unique()}
    assert len(set(order.values())) == data.TOKEN_CLASSES
    assert all(order[int(y)] == int(h.argmax()) for h, y in zip(hits, labels))


def test_a_small_model_learns_it():
    torch.manual_seed(0)
    train, test = data.token_datasets(seed=0, size=4800)
    model = nn.Sequential(nn.EmbeddingBag(data.TOKEN_VOCAB, 16, mode="sum"), nn.Linear(16, data.TOKEN_CLASSES))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.05)
    ids, labels = train.tensors
    for step in range(100):
        batch = slice(step * 32 % 4800, step * 32 % 4800 + 32)
        loss = nn.functional.cross_entropy(model(ids[batch]), labels[batch])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    test_ids, test_labels = test.tensors
    accuracy = (model(test_ids).argmax(1) == test_labels).float().mean().item()
    assert accuracy > 0.9, accuracy
