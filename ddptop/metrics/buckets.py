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


def same_layout(layers: Sequence[tuple[str, int]], bytes_per_param: float, sizes: Sequence[float]) -> str | None:
    """Why a bucket-size sweep measures nothing, or None: every size gives DDP the same buckets (issue 26: the tiny
    model's 0.08 MB of gradients is one bucket at 5, 10, 25 and 50 MB, so its four segments are one setting four
    times and any difference between them is noise)."""
    sizes = sorted({float(s) for s in sizes})
    if len(sizes) < 2:
        return None
    layouts = {tuple(b.nbytes for b in ddp_buckets(layers, bytes_per_param, size)) for size in sizes}
    if len(layouts) > 1:
        return None
    (layout,) = layouts
    many = len(layout) > 1
    return (f"the bucket sizes {', '.join(f'{s:g}' for s in sizes)} MB all give DDP the same "
            f"{len(layout)} bucket{'s' if many else ''} ({' + '.join(f'{n / 1e6:.3g}' for n in layout)} MB of "
            "gradients): the sweep measures one setting several times, and any difference between its segments is "
            "noise (a larger model shows what bucketing changes, e.g. --model vgg11)")
