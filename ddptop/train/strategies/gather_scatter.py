"""`gather-scatter`: per parameter, gather every rank's gradient to rank 0, average there, scatter it back (CS744 part 2a).

Bytes per parameter of S bytes: rank 0 receives (N−1)·S and sends (N−1)·S; every other rank sends S and
receives S. Rank 0's link carries N−1 times what a ring would, which is why this is the slowest sync.
"""

import torch
import torch.distributed as dist

from ddptop.metrics import wire
from ddptop.train.strategies.base import Strategy


class GatherScatter(Strategy):
    name = "gather-scatter"

    def after_backward(self) -> None:
        root = self.rank == 0
        n = self.world_size
        for name, param in self.named_params:
            grad = self.grad(param)
            size = grad.numel() * grad.element_size()
            gathered = [torch.empty_like(grad) for _ in range(n)] if root else None
            start = self.comm.arrive()
            dist.gather(grad, gather_list=gathered, dst=0)
            mid = self.comm.now()
            self.comm.add(f"gather {name}", start, mid, size, *wire.gather(size, n, root))
            chunks = None
            if root:
                mean = torch.stack(gathered).mean(dim=0)
                chunks = [mean] * n
            start = self.comm.arrive()
            dist.scatter(grad, scatter_list=chunks, src=0)
            self.comm.add(f"scatter {name}", start, self.comm.now(), size, *wire.scatter(size, n, root))
