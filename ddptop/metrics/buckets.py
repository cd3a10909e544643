"""Provides the DDP bucket layout a bucket size will give, from the model's per-layer parameter counts (pure).

After its first step DDP rebuilds its buckets in the order gradients become ready, which is about the reverse of
the order the layers are defined in; a bucket closes once it holds at least bucket_cap_mb MiB (torch 2.x; one
tensor may overflow it). Checked against torch's real layout: VGG-11 at 25 MB gives 28.3 + 8.6 MB, at 5 MB five
buckets, tiny at 0.02 MB 63 + 21 KB. Here a layer's weight and bias stay together, so a bucket edge can differ
from DDP's by one bias (a few hundred bytes). DDP's very first step sends everything as one bucket.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

MIB = 1024 * 1024


@dataclass(frozen=True)
class Bucket:
    nbytes: int
    layers: tuple[str, ...]  # in the order DDP fills the bucket (last layer first)

    def span(self) -> str:
        """`classifier … features.8`: the layers it holds, last first."""
        return self.layers[0] if len(self.layers) == 1 else f"{self.layers[0]} … {self.layers[-1]}"


def ddp_buckets(layers: Sequence[tuple[str, int]], bytes_per_param: float, bucket_mb: float) -> list[Bucket]:
    """Buckets in the order DDP all-reduces them (bucket 0 first: the last layers)."""
    cap = bucket_mb * MIB
    out: list[Bucket] = []
    size, names = 0.0, []
    for name, count in reversed(list(layers)):
        size += count * bytes_per_param
        names.append(str(name))
        if size >= cap:
            out.append(Bucket(int(size), tuple(names)))
            size, names = 0.0, []
    if names:
        out.append(Bucket(int(size), tuple(names)))
    return out
