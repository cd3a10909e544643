"""Every trained parameter counted where it lives (issue 44): the per-layer counts that RunStarted records, and that
the bucket layout, the controls' preview and the what-if model read, hold attention's in-projection (held by
nn.MultiheadAttention itself, beside its out_proj child), a bare nn.Parameter on any module and a tied weight once,
and add up to what torch says the model has. The bucket layout is checked against DDP's own reducer on 2 gloo ranks
(its rebuilt buckets after the first steps), which ddptop did not compute."""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

import ports
from ddptop.metrics.buckets import ddp_buckets
from ddptop.train.models import build_model, layer_param_counts


class Block(nn.Module):
    def __init__(self, d: int):
        super().__init__()
        self.attn = nn.MultiheadAttention(d, 4, batch_first=True)
        self.ff = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))
        self.norm = nn.LayerNorm(d)
        self.gate = nn.Parameter(torch.ones(d))  # a bare parameter on a module with children

    def forward(self, h):
        a, _ = self.attn(h, h, h)
        return self.norm(h + self.ff(h + a) * self.gate)


class Transformer(nn.Module):
    """Embedding tied to the output head, two attention blocks."""

    def __init__(self, d: int = 64, vocab: int = 500):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.blocks = nn.Sequential(Block(d), Block(d))
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.emb.weight  # tied: one tensor, counted once
        self.frozen = nn.Parameter(torch.zeros(7), requires_grad=False)  # not trained: not counted

    def forward(self, x):
        return self.head(self.blocks(self.emb(x)))


# 500 × 64 embedding (tied) + 2 blocks of (4·64² + 4·64 attention, 2·4·64² + 5·64 feed-forward, 2·64 norm, 64 gate)
TOTAL = 4 * (500 * 64 + 2 * (4 * 64 * 64 + 4 * 64 + 8 * 64 * 64 + 5 * 64 + 2 * 64 + 64))


def test_the_counts_hold_every_trained_parameter_once_where_it_lives():
    model = Transformer()
    counts = dict(layer_param_counts(model))
    trained = [p for p in model.parameters() if p.requires_grad]  # torch lists a tied tensor once
    assert sum(counts.values()) * 4 == sum(p.numel() * p.element_size() for p in trained) == TOTAL
    attn = model.blocks[0].attn
    assert counts["blocks.0.attn"] == attn.in_proj_weight.numel() + attn.in_proj_bias.numel()  # not a leaf
    assert counts["blocks.0.attn.out_proj"] == attn.out_proj.weight.numel() + attn.out_proj.bias.numel()
    assert counts["blocks.0"] == 64 and counts["emb"] == 500 * 64 and "head" not in counts  # the tie: once
    assert "frozen" not in counts and "(model)" not in counts


@pytest.mark.parametrize("name", ["tiny", "vgg11", "resnet18", "bert-mini"])
def test_each_built_in_models_counts_add_up_to_its_parameters(name):
    model = build_model(name)
    assert sum(c for _, c in layer_param_counts(model)) == sum(p.numel() for p in model.parameters()
                                                               if p.requires_grad)


def _example():
    """ddptop/examples/transformer.py's model and a padded dict batch of its own items (issue 44's Transformer)."""
    from ddptop.examples import transformer

    train, _ = transformer.data(size=8)
    return transformer.model(), transformer.collate([train[i] for i in range(4)])


MODELS = {"tied": lambda: (Transformer(), torch.randint(0, 500, (2, 16))), "example": _example}


def _reducer_buckets(rank: int, port: int, sizes: list, out, which: str = "tied") -> None:
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        for mb in sizes:
            torch.manual_seed(0)
            model, batch = MODELS[which]()
            ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=mb)
            for _ in range(3):  # DDP rebuilds its buckets in the order gradients became ready, after step 1
                ddp(batch).sum().backward()
            data = ddp._get_ddp_logging_data()
            if rank == 0:
                out.put((mb, data.get("has_rebuilt_buckets"), str(data.get("rebuilt_bucket_sizes", ""))))
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("which", ["tied", "example"])
def test_the_bucket_layout_is_ddps_own_at_0_05_and_1_mb(which):
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = ports.port()
    procs = [ctx.Process(target=_reducer_buckets, args=(r, port, [0.05, 1.0], out, which)) for r in range(2)]
    for p in procs:
        p.start()
    got = {}
    try:
        for _ in range(2):
            mb, rebuilt, sizes = out.get(timeout=240)
            got[mb] = (rebuilt, [int(s) for s in sizes.split(",") if s.strip()])
    finally:
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()
    model = MODELS[which]()[0]
    layers = layer_param_counts(model)
    total = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    assert which != "tied" or total == TOTAL
    for mb in (0.05, 1.0):
        rebuilt, sizes = got[mb]
        predicted = [b.nbytes for b in ddp_buckets(layers, 4, mb)]
        assert rebuilt == 1 and sum(sizes) == sum(predicted) == total, (mb, sizes, predicted)
        assert len(predicted) == len(sizes), (mb, predicted, sizes)  # the count, as the reducer made it
    assert len(got[1.0][1]) == 1 and len(got[0.05][1]) >= 5
