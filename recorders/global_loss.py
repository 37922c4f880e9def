"""The global loss of a step: the mean of the ranks' local losses over the data-parallel ranks.

Used by zero-code recording, which only sees each rank's local loss (the tensor backward ran on).
Which ranks are data parallel is read from the parameters, as coords.py does:
  - plain tensors (DDP, or one process): every rank of the world is a data-parallel replica;
  - DTensors (FSDP2, TP, SimpleFSDP+TP, HSDP): the mesh dims named like dp (coords.DP_NAMES), or
    FSDP2's unnamed 1-D mesh; tp ranks share one batch and one loss, so they are not averaged.
The mean is an all-reduce: every rank must call `mean_over` in the same step, a rank without a
loss included (it contributes nothing and is not counted), or the collective hangs.
"""

from __future__ import annotations

from typing import Iterable

import torch
import torch.distributed as dist

from tracekit.recorders.coords import DP_NAMES, is_dtensor, meshes_of


def dp_groups(params: Iterable[torch.Tensor]) -> list:
    """The process groups whose ranks' losses average to the global loss (empty: no averaging)."""
    if not (dist.is_available() and dist.is_initialized()):
        return []
    meshes = meshes_of(params)
    if not meshes:
        return [dist.group.WORLD] if dist.get_world_size() > 1 else []
    for mesh in meshes:
        names = mesh.mesh_dim_names
        dims = [i for i, n in enumerate(names) if n in DP_NAMES] if names else ([0] if mesh.ndim == 1 else [])
        if dims:
            return [mesh.get_group(i) for i in dims if mesh.size(i) > 1]
    return []


# Loss dtypes the ranks agree on before averaging (an index into this tuple travels in the count
# all-reduce); any other dtype is averaged in float32.
_DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)


def mean_over(local: torch.Tensor | None, groups: list, device: torch.device) -> torch.Tensor | None:
    """Mean of `local` over the ranks of `groups` (nested, e.g. HSDP's replicate and shard dims).

    Bit for bit what a DDP script computes: `all_reduce(loss, SUM)` in the loss's own dtype, then
    `/ world_size` in that dtype (docs/ZEROCODE.md). A first, small all-reduce agrees on how many
    ranks have a loss and on its dtype, so a rank without one still takes part (it adds a zero and
    is not counted). None when no rank had a loss.
    """
    if local is not None:
        local = local.detach()
        if is_dtensor(local):
            local = local.full_tensor()
        device = local.device
        code = _DTYPES.index(local.dtype) if local.dtype in _DTYPES else 0
        info = torch.tensor([1.0, float(code)], dtype=torch.float64, device=device)
    else:
        info = torch.zeros(2, dtype=torch.float64, device=device)
    for group in groups:
        dist.all_reduce(info, op=dist.ReduceOp.SUM, group=group)  # gloo has no AVG
    count, codes = info.tolist()
    if count == 0:
        return None
    dtype = _DTYPES[int(round(codes / count))]
    if local is not None:
        total = local.reshape(()).to(dtype).clone()
    else:
        total = torch.zeros((), dtype=dtype, device=device)
    for group in groups:
        dist.all_reduce(total, op=dist.ReduceOp.SUM, group=group)
    return total / int(count)
