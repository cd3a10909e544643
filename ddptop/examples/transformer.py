"""A Transformer encoder classifier as a researcher writes it: dict items of variable length, a collate_fn that pads
them into {"ids", "mask", "label"}, a label-smoothed loss that reads the label from the batch.

    ddptop --model ddptop.examples.transformer:model --dataset ddptop.examples.transformer:data \\
           --collate ddptop.examples.transformer:collate --loss ddptop.examples.transformer:loss \\
           --tokens ddptop.examples.transformer:tokens

or the same parts in the script's own loop (ddptop's library API), unchanged:

    torchrun --nproc-per-node 2 -m ddptop.examples.transformer

A batch that is not an (inputs, target) pair goes to the model whole, and the loss gets (output, batch)
(docs/how-to/own-model.md). `tokens` counts a batch's real tokens, for tokens/s beside samples/s: its mask marks the
padding (torch's convention), so ddptop is told rather than guessing (it sums only an `attention_mask` by itself).
"""

import os

import torch
from torch import nn
from torch.utils.data import Dataset

VOCAB, WIDTH, CLASSES, MIN_LEN, MAX_LEN = 100, 64, 4, 8, 48
PAD = 0
MARKERS = range(1, 1 + CLASSES)  # the class is the marker token the sequence holds; the other tokens are noise


class Sequences(Dataset):
    """Items {"ids": a LongTensor of MIN_LEN..MAX_LEN tokens, "label": int}: lengths vary, as real text's do."""

    num_classes = CLASSES

    def __init__(self, size: int, generator: torch.Generator):
        self.items = []
        for _ in range(size):
            length = int(torch.randint(MIN_LEN, MAX_LEN + 1, (), generator=generator))
            ids = torch.randint(1 + CLASSES, VOCAB, (length,), generator=generator)
            label = int(torch.randint(0, CLASSES, (), generator=generator))
            ids[int(torch.randint(0, length, (), generator=generator))] = MARKERS[label]
            self.items.append({"ids": ids, "label": label})

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> dict:
        return self.items[index]


def data(seed: int = 0, size: int = 2048):
    generator = torch.Generator().manual_seed(seed)
    return Sequences(size, generator), Sequences(max(1, size // 8), generator)


def collate(items: list[dict]) -> dict:
    """Pad to the batch's longest item; mask is True at padding (torch's src_key_padding_mask)."""
    longest = max(len(item["ids"]) for item in items)
    ids = torch.full((len(items), longest), PAD, dtype=torch.long)
    for row, item in enumerate(items):
        ids[row, :len(item["ids"])] = item["ids"]
    return {"ids": ids, "mask": ids == PAD, "label": torch.tensor([item["label"] for item in items])}


def tokens(batch: dict) -> int:
    """The batch's real tokens: the positions its mask does not mark as padding."""
    return int((~batch["mask"]).sum())


class Classifier(nn.Module):
    def __init__(self, num_classes: int = CLASSES):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH, padding_idx=PAD)
        self.position = nn.Parameter(torch.randn(MAX_LEN, WIDTH) * 0.02)  # a bare parameter, held by this module
        layer = nn.TransformerEncoderLayer(WIDTH, nhead=4, dim_feedforward=2 * WIDTH, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)
        self.head = nn.Linear(WIDTH, num_classes)

    def forward(self, batch: dict) -> torch.Tensor:
        ids, mask = batch["ids"], batch["mask"]
        hidden = self.encoder(self.embed(ids) + self.position[:ids.shape[1]], src_key_padding_mask=mask)
        keep = (~mask).unsqueeze(-1).to(hidden.dtype)
        return self.head((hidden * keep).sum(1) / keep.sum(1))  # the mean over real tokens


def model(num_classes: int = CLASSES) -> nn.Module:
    return Classifier(num_classes)


def loss(output: torch.Tensor, batch: dict) -> torch.Tensor:
    return nn.functional.cross_entropy(output, batch["label"], label_smoothing=0.1)


def main() -> None:
    """The same parts in the script's own loop, under torchrun: ddptop's library API."""
    from torch.utils.data import DataLoader
    from torch.utils.data.distributed import DistributedSampler

    from ddptop.api import join

    steps = int(os.environ.get("TRANSFORMER_STEPS", "200"))
    job = join(strategy="ddp", log_every=20)
    torch.manual_seed(0)
    net = model()
    optimizer = torch.optim.AdamW(net.parameters(), lr=1e-3)
    net, optimizer = job.prepare(net, optimizer)
    train, _ = data()
    sampler = DistributedSampler(train, num_replicas=job.world_size, rank=job.rank)
    loader = DataLoader(train, batch_size=32, sampler=sampler, collate_fn=collate, drop_last=True)
    epoch = 0
    while job.step_count < steps and not job.stopped:
        sampler.set_epoch(epoch)
        for batch in loader:
            if job.step_count >= steps or job.stopped:
                break
            # the batch size is read from the batch itself; its tokens are ours to count (tokens/s)
            with job.step(batch=batch, epoch=epoch, tokens=tokens(batch)):
                batch = job.to_device(batch)
                value = loss(net(batch), batch)
                value.backward()
                optimizer.step()
                optimizer.zero_grad()
                job.log(loss=value)
        epoch += 1
    job.finish()


if __name__ == "__main__":
    main()
