"""What a parallel mode hands the training loop: the model to call and its data-parallel layout."""

from __future__ import annotations

from dataclasses import dataclass

import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh


@dataclass
class ParallelModel:
    module: nn.Module  # what the loop calls: wrapped and, for compiled modes, compiled
    named_module: nn.Module  # same parameters, canonical names ("0.weight", ...) for recording
    dp_degree: int  # how many slices the global batch is cut into
    dp_rank: int  # which slice this rank trains on
    dp_group: dist.ProcessGroup | None  # ranks whose local losses average to the global loss
    mesh: DeviceMesh | None = None
    # simplefsdp_tp's dp gather sums gradients over dp, so its local mean loss is divided by dp.
    loss_divisor: int = 1
