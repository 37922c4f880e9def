"""simplefsdp_tp: SimpleFSDP (data parallel by DTensor ops) combined with tensor parallelism.

Mesh (dp, tp), tp innermost. The model is the bias-free variant. Each weight is stored sharded
over both mesh dims (one (dp x tp)-th per rank):
  first weight  (256 x 128): (Shard(1), Shard(0))  -> tp splits output features (colwise)
  second weight (128 x 256): (Shard(0), Shard(1))  -> tp splits input features (rowwise)
Inside forward each weight is gathered across dp by a differentiable DTensor redistribute
(Shard -> Replicate on the dp dim), so autograd turns the gather's backward into a reduce-scatter
of the gradient. That gather is activation-checkpointed (recomputed in backward instead of keeping
the full weight alive). The rest is plain DTensor tensor parallelism on the tp sub-mesh, and the
whole model is compiled with torch.compile(fullgraph=True).

The gradient a rank computes for a gathered weight is declared Partial over dp (a sum across dp
ranks), so each rank's local mean loss is divided by the dp degree before backward: the summed
gradients are then those of the mean loss over the global batch.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor import DTensor, Partial, Placement, Replicate, Shard, distribute_tensor
from torch.utils.checkpoint import checkpoint

from .errors import WorkloadError
from .parallel_model import ParallelModel
from .runtime import Runtime

# (dp placement, tp placement) of each Linear's weight, by its index in the Sequential.
WEIGHT_PLACEMENTS: dict[int, tuple[Placement, Placement]] = {
    0: (Shard(1), Shard(0)),
    2: (Shard(0), Shard(1)),
}


class DataParallelGatheredLinear(nn.Module):
    """A bias-free Linear whose weight lives as a 2-D (dp, tp) DTensor and is gathered over dp
    in every forward; takes and returns DTensors on the tp sub-mesh."""

    def __init__(self, linear: nn.Linear, mesh: DeviceMesh, placements: tuple[Placement, Placement]):
        super().__init__()
        if linear.bias is not None:
            raise WorkloadError("simplefsdp_tp uses the bias-free model")
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.tp_mesh = mesh["tp"]
        self.tp_placement = placements[1]
        self.weight = nn.Parameter(distribute_tensor(linear.weight.detach(), mesh, placements))

    def gather_over_dp(self, weight: DTensor) -> DTensor:
        gathered = weight.redistribute(weight.device_mesh, (Replicate(), self.tp_placement))
        # The gradient that comes back to this local tensor is this dp rank's share of a sum
        # (Partial over dp), so redistribute's backward reduce-scatters it into the dp shards.
        local = gathered.to_local(grad_placements=(Partial(), self.tp_placement))
        return DTensor.from_local(local, self.tp_mesh, (self.tp_placement,), run_check=False)

    def forward(self, x: DTensor) -> DTensor:
        weight = checkpoint(self.gather_over_dp, self.weight, use_reentrant=False)
        return F.linear(x, weight)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias=False"


class TensorParallelSequential(nn.Sequential):
    """Runs its layers on DTensors of the tp sub-mesh: plain local batch in, plain full output out
    (every tp rank of a dp group holds the same batch slice and gets the same output)."""

    def __init__(self, *layers: nn.Module, tp_mesh: DeviceMesh):
        super().__init__(*layers)
        self.tp_mesh = tp_mesh

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = DTensor.from_local(x, self.tp_mesh, (Replicate(),), run_check=False)
        for layer in self:
            hidden = layer(hidden)
        # The rowwise layer leaves a partial sum over tp: all-reduce it to the full output.
        return hidden.redistribute(self.tp_mesh, (Replicate(),)).to_local()


def parallelize_simplefsdp_tp(
    model: nn.Sequential, runtime: Runtime, tp: int | None, compile_backend: str | None
) -> ParallelModel:
    if tp is None or tp < 1 or runtime.world_size % tp:
        raise WorkloadError(f"simplefsdp_tp needs the world size ({runtime.world_size}) divisible by --tp ({tp})")
    dp = runtime.world_size // tp
    mesh = init_device_mesh(runtime.device.type, (dp, tp), mesh_dim_names=("dp", "tp"))
    layers = [
        DataParallelGatheredLinear(layer, mesh, WEIGHT_PLACEMENTS[index]) if index in WEIGHT_PLACEMENTS else layer
        for index, layer in enumerate(model)
    ]
    sharded = TensorParallelSequential(*layers, tp_mesh=mesh["tp"])
    compiled = torch.compile(sharded, backend=compile_backend, fullgraph=True) if compile_backend else sharded
    return ParallelModel(
        module=compiled,
        named_module=sharded,  # torch.compile would prefix every name with "_orig_mod."
        dp_degree=dp,
        dp_rank=mesh.get_local_rank("dp"),
        dp_group=mesh.get_group("dp"),
        mesh=mesh,
        loss_divisor=dp,
    )
