"""Turning live tensors into full CPU copies and named store entries.

Copies are taken on the training thread, so the recorded bits are exactly what the loop had at that
moment even if the loop later updates the tensors in place. Sharded DTensors (FSDP2, TP) are
gathered with full_tensor(), a collective: every rank must call it for the same tensors in the same
order, which is why rank selection drops writes but never gathers.
"""

from __future__ import annotations

import fnmatch
from typing import Any, Iterator

import torch

from tracekit.recorders.coords import is_dtensor
from tracekit.recorders.names import canonical_name  # noqa: F401 - where the recorder has always found it


def select(names: list[str], globs: tuple[str, ...]) -> list[str]:
    if not globs:
        return names
    return [n for n in names if any(fnmatch.fnmatchcase(n, g) for g in globs)]


def full_cpu(t: torch.Tensor, keep: bool = True, copy: bool = True) -> torch.Tensor | None:
    """A full, detached CPU copy; gathers DTensors. keep=False: gather if collective, copy nothing.
    copy=False: a tensor already full, contiguous and on the CPU comes back as it is, for a caller
    that writes its bytes away before the loop can change them (the spool hand-off)."""
    t = t.detach()
    gathered = is_dtensor(t)
    if gathered:
        t = t.full_tensor()
    if not keep:
        return None
    if t.device.type == "cpu":
        return t.contiguous() if gathered or not copy else t.clone(memory_format=torch.contiguous_format)
    return t.to("cpu").contiguous()


def _row_shard_group(t) -> tuple | None:
    """A key for DTensors whose gather can be batched: one Shard(0) dim on a 1-D mesh (FSDP2's case)."""
    from torch.distributed.tensor import Shard

    if not is_dtensor(t) or t.device_mesh.ndim != 1 or t.ndim == 0:
        return None
    (placement,) = t.placements
    if not (isinstance(placement, Shard) and placement.dim == 0):
        return None
    return (id(t.device_mesh), t.dtype, t.device)


def _gather_row_shards(items: list[tuple[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Full tensors of many row-sharded DTensors with one all_gather instead of one per tensor.

    DTensor shards rows like torch.chunk: each rank holds ceil(rows/W) rows except the last ones.
    Every rank packs its shards into equal, padded slots, so one collective moves them all.
    """
    import torch.distributed as dist

    mesh = items[0][1].device_mesh
    world = mesh.size()
    layout, slot = [], 0
    for name, t in items:
        rows, width = t.shape[0], (t.numel() // t.shape[0] if t.shape[0] else 0)
        per = -(-rows // world)  # rows per rank, torch.chunk style
        layout.append((name, t, rows, width, per, slot))
        slot += per * width
    first = items[0][1]
    send = torch.zeros(slot, dtype=first.dtype, device=first.device)
    for name, t, rows, width, per, off in layout:
        local = t.to_local().reshape(-1)
        send[off : off + local.numel()].copy_(local)
    recv = [torch.empty_like(send) for _ in range(world)]
    dist.all_gather(recv, send, group=mesh.get_group())
    out = {}
    for name, t, rows, width, per, off in layout:
        parts = []
        for r in range(world):
            n = max(0, min(per, rows - r * per))
            parts.append(recv[r][off : off + n * width])
        out[name] = torch.cat(parts).reshape(t.shape)
    return out


def gather_full_cpu(items: list[tuple[str, torch.Tensor]], keep: bool = True,
                    copy: bool = True) -> dict[str, torch.Tensor]:
    """Full CPU copies of named tensors, in order; batches FSDP2-style gathers into one collective each.

    Every rank must call this with the same names in the same order (it runs collectives).
    keep=False runs the collectives and keeps nothing (ranks that do not write).
    """
    groups: dict[tuple, list[tuple[str, torch.Tensor]]] = {}
    for name, t in items:
        key = _row_shard_group(t.detach())
        if key is not None:
            groups.setdefault(key, []).append((name, t.detach()))
    gathered: dict[str, torch.Tensor] = {}
    for members in groups.values():
        gathered.update(_gather_row_shards(members))
    out = {}
    for name, t in items:
        if name in gathered:
            if keep:
                full = gathered[name]
                out[name] = full if full.device.type == "cpu" else full.to("cpu")
        else:
            full = full_cpu(t, keep=keep, copy=copy)
            if full is not None:
                out[name] = full
    return out


def flatten_output(obj: Any, prefix: str = "output") -> Iterator[tuple[str, torch.Tensor]]:
    """Named tensors inside a model output: a tensor, or tuples/lists/dicts/dataclasses of them."""
    if isinstance(obj, torch.Tensor):
        yield prefix, obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from flatten_output(v, f"{prefix}.{k}")
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            yield from flatten_output(v, f"{prefix}.{i}")
    elif hasattr(obj, "__dataclass_fields__"):
        for k in obj.__dataclass_fields__:
            yield from flatten_output(getattr(obj, k), f"{prefix}.{k}")
