"""A model of big matrices and little compute, for seeing gradient bytes on a network (issue 25): 3072·512 + 512·512
+ 512·10 weights (1.84 M parameters, 7.4 MB of float32 gradients in 6 tensors) on 32×32 RGB images, a step of
batch 32 in about 0.05 s of one core. Its matrices are wide enough that PowerSGD's rank-32 factors are a tenth of
them (wire.powersgd_allreduce: 0.61 MB of 7.4), so compression shows on the NIC counters, not just in a formula.

    ddptop --model ddptop.examples.wide_mlp:mlp ...      (ddptop/own_profiles/wire-lab.toml, tests/lab/test_wire_bytes.py)
"""

from torch import nn


def mlp(num_classes: int = 10) -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(3072, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                         nn.Linear(512, num_classes))
