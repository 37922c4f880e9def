"""The four parallel modes: each takes the CPU-built model (already on its device) and returns it
wrapped or sharded, with what the loop needs to know about the data-parallel layout."""

from __future__ import annotations

import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
import torch
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
from torch.nn.parallel import DistributedDataParallel

from .errors import WorkloadError
from .parallel_model import ParallelModel
from .runtime import Runtime
from .simplefsdp_tp import parallelize_simplefsdp_tp


def parallelize_ddp(model: nn.Module, runtime: Runtime) -> ParallelModel:
    device_ids = [runtime.device.index] if runtime.device.type == "cuda" else None
    wrapped = DistributedDataParallel(model, device_ids=device_ids)
    return ParallelModel(
        module=wrapped,
        named_module=model,  # DDP would prefix every name with "module."
        dp_degree=runtime.world_size,
        dp_rank=runtime.rank,
        dp_group=dist.group.WORLD,
    )


def parallelize_fsdp(model: nn.Module, runtime: Runtime, mixed_precision: str | None = None) -> ParallelModel:
    mesh = init_device_mesh(runtime.device.type, (runtime.world_size,), mesh_dim_names=("dp",))
    policy = MixedPrecisionPolicy()  # full precision
    if mixed_precision is not None:  # low-precision compute, float32 gradient reduction and model output
        policy = MixedPrecisionPolicy(param_dtype=getattr(torch, mixed_precision), reduce_dtype=torch.float32,
                                      output_dtype=torch.float32)
    # FSDP2: each Linear is its own unit (its weights gathered just for its forward/backward),
    # then the root; this must happen before the optimizer is built (parameters become DTensors).
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    return ParallelModel(
        module=model,
        named_module=model,
        dp_degree=runtime.world_size,
        dp_rank=mesh.get_local_rank("dp"),
        dp_group=mesh.get_group("dp"),
        mesh=mesh,
    )


def parallelize_tp(model: nn.Module, runtime: Runtime) -> ParallelModel:
    mesh = init_device_mesh(runtime.device.type, (runtime.world_size,), mesh_dim_names=("tp",))
    # Colwise then Rowwise: the hidden activation stays sharded, one all-reduce per forward,
    # and every rank ends with the full output of the whole global batch.
    parallelize_module(model, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    return ParallelModel(module=model, named_module=model, dp_degree=1, dp_rank=0, dp_group=None, mesh=mesh)


def parallelize(
    mode: str, model: nn.Module, runtime: Runtime, tp: int | None, compile_backend: str | None,
    mixed_precision: str | None = None,
) -> ParallelModel:
    """Dispatch to the mode's parallelize_* (tp and compile_backend matter to simplefsdp_tp only)."""
    if mode == "ddp":
        return parallelize_ddp(model, runtime)
    if mode == "fsdp":
        return parallelize_fsdp(model, runtime, mixed_precision)
    if mode == "tp":
        return parallelize_tp(model, runtime)
    if mode == "simplefsdp_tp":
        return parallelize_simplefsdp_tp(model, runtime, tp=tp, compile_backend=compile_backend)
    raise WorkloadError(f"unknown parallelism {mode!r}")
