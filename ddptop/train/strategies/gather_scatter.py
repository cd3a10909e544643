"""`gather-scatter`: per parameter, gather every rank's gradient to rank 0, average there, scatter it back (CS744 part 2a).

Bytes per parameter of S bytes: rank 0 receives (N−1)·S and sends (N−1)·S; every other rank sends S and
receives S. Rank 0's link carries N−1 times what a ring would, which is why this is the slowest sync.
With compress fp16/bf16 the gradient travels as 2-byte values both ways (S/2); rank 0 averages in float32.
"""

import torch
import torch.distributed as dist

from ddptop.metrics import wire
from ddptop.train.strategies.base import Strategy


class GatherScatter(Strategy):
    name = "gather-scatter"

    def after_backward(self) -> None:
        root = self.rank == 0
        n, dtype = self.world_size, self.wire_dtype()
        for name, param in self.named_params:
            grad = self.grad(param)
            sent = grad if dtype is None else grad.to(dtype)
            size = sent.numel() * sent.element_size()
            gathered = [torch.empty_like(sent) for _ in range(n)] if root else None
            start = self.comm.arrive()
            dist.gather(sent, gather_list=gathered, dst=0)
            mid = self.comm.now()
            self.comm.add(f"gather {name}", start, mid, size, *wire.gather(size, n, root))
            chunks = None
            if root:
                mean = torch.stack(gathered).mean(dim=0) if dtype is None else (
                    torch.stack(gathered).float().mean(dim=0).to(dtype))
                chunks = [mean] * n
            start = self.comm.arrive()
            dist.scatter(sent, scatter_list=chunks, src=0)
            self.comm.add(f"scatter {name}", start, self.comm.now(), size, *wire.scatter(size, n, root))
            if sent is not grad:
                grad.copy_(sent)
