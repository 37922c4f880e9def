"""A rank's place in the run: rank, world, data/tensor-parallel degree and rank, device meshes."""

from __future__ import annotations

import os
import sys
from typing import Iterable

import torch
import torch.distributed as dist

# Mesh dimension names we read as data parallel (one list, read by the store's loss derivation
# too) or tensor parallel (torchtitan's names included).
from tracekit.store.global_loss import DP_NAMES

TP_NAMES = ("tp", "tensor_parallel", "model_parallel")


def _dtensor_type():
    """DTensor's class, or None while nothing in the process has imported it: no tensor can be a
    DTensor before its module is loaded, so a job that never loads it (a world of one, a DDP job
    without torch._dynamo) is spared the import (~0.8 CPU-s of every such rank's start-up)."""
    return getattr(sys.modules.get("torch.distributed.tensor"), "DTensor", None)


def is_dtensor(t) -> bool:
    cls = _dtensor_type()
    return cls is not None and isinstance(t, cls)


def meshes_of(tensors: Iterable[torch.Tensor]) -> list:
    """The distinct DeviceMeshes that DTensors among `tensors` live on, in first-seen order."""
    seen, out = set(), []
    for t in tensors:
        if is_dtensor(t) and id(t.device_mesh) not in seen:
            seen.add(id(t.device_mesh))
            out.append(t.device_mesh)
    return out


def describe_mesh(mesh) -> dict:
    names = list(mesh.mesh_dim_names) if mesh.mesh_dim_names else [f"dim{i}" for i in range(mesh.ndim)]
    coord = mesh.get_coordinate()
    return {
        "dim_names": names,
        "shape": list(mesh.shape),
        "coordinate": list(coord) if coord is not None else None,
        "device_type": mesh.device_type,
    }


def _find(meshes: list[dict], names: tuple[str, ...]) -> tuple[int, int] | None:
    for m in meshes:
        for i, n in enumerate(m["dim_names"]):
            if n in names and m["coordinate"] is not None:
                return m["shape"][i], m["coordinate"][i]
    return None


def detect_coords(tensors: Iterable[torch.Tensor] = (), overrides: dict | None = None) -> dict:
    """Coordinates from torch.distributed and the meshes of DTensor parameters; overrides win."""
    if dist.is_available() and dist.is_initialized():
        rank, world = dist.get_rank(), dist.get_world_size()
    else:
        rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    meshes = [describe_mesh(m) for m in meshes_of(tensors)]
    tp = _find(meshes, TP_NAMES) or (1, 0)
    dp = _find(meshes, DP_NAMES)
    if dp is None:
        # An unnamed 1-D mesh is FSDP2's default; with no mesh at all (DDP, plain) every rank is a replica.
        unnamed = [m for m in meshes if len(m["shape"]) == 1 and m["dim_names"][0] == "dim0"]
        if unnamed and unnamed[0]["coordinate"] is not None:
            dp = (unnamed[0]["shape"][0], unnamed[0]["coordinate"][0])
        else:
            dp = (max(1, world // tp[0]), rank // tp[0])
    coords = {
        "rank": rank,
        "local_rank": int(os.environ.get("LOCAL_RANK", rank)),
        "world_size": world,
        "dp_degree": dp[0],
        "dp_rank": dp[1],
        "tp_degree": tp[0],
        "tp_rank": tp[1],
        "meshes": meshes,
    }
    coords.update(overrides or {})
    return coords
