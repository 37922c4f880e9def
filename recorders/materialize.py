"""Turning live tensors into full CPU copies and named store entries.

Copies are taken on the training thread, so the recorded bits are exactly what the loop had at that
moment even if the loop later updates the tensors in place. Into a format 2 store every rank
records only what it holds (local_cpu): its pieces of sharded DTensors (FSDP2, TP), with where
they sit, and readers assemble whole tensors (tracekit/store/shards.py) - no collective. Otherwise
(format 1, a rank selection, layouts local_piece() cannot express) sharded DTensors are gathered
with full_tensor(), a collective: every rank must call it for the same tensors in the same order,
which is why rank selection drops writes but never gathers.
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
    if not is_dtensor(t) or t.device_mesh.ndim != 1 or t.ndim == 0:
        return None
    from torch.distributed.tensor import Shard  # loaded already: t is a DTensor

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


# (mesh id, placements, global shape) -> (mesh, the local shape, this rank's Shard or None), or
# None when the layout needs a gather. A DTensor's layout is fixed for the run, and working it
# out costs ~0.3 ms of Python per tensor (mesh coordinates, offsets, peers): ~180 ms a step
# for a 200-tensor model's parameters, gradients and deltas, on the training thread. The mesh
# is kept in the value so its id is never reused for another one while the entry lives.
_LAYOUTS: dict[tuple, tuple | None] = {}


def _local_tensor(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's local tensor, detached, without DTensor dispatch or an autograd node (to_local())."""
    local = getattr(t, "_local_tensor", None)
    return (local if local is not None else t.to_local()).detach()


def local_piece(t: torch.Tensor):
    """This rank's piece of a DTensor and where it sits in the full tensor (a tracekit.store Shard),
    when taking it needs no communication; (local tensor, None) for a DTensor replicated on every
    mesh dimension (the local tensor is whole). None when the layout needs a gather: a Partial
    (pending reduction) or strided-shard placement, or a local tensor that is not exactly the
    block DTensor's layout assigns this rank."""
    key = (id(t.device_mesh), tuple(t.placements), tuple(t.shape))
    try:
        layout = _LAYOUTS[key]
    except KeyError:
        layout = _LAYOUTS[key] = _layout(t)
    if layout is None:
        return None
    _, shape, shard = layout
    local = _local_tensor(t)
    if shape is not None and tuple(local.shape) != shape:
        return None
    return local, shard


def _layout(t: torch.Tensor) -> tuple | None:
    from torch.distributed.tensor import Replicate, Shard as ShardPlacement
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    from tracekit.store.shards import Shard

    placements = t.placements
    mesh = t.device_mesh
    if not all(type(p) is ShardPlacement or isinstance(p, Replicate) for p in placements):
        return None
    if not any(type(p) is ShardPlacement for p in placements):
        return mesh, None, None
    coordinate = mesh.get_coordinate()
    if coordinate is None:  # this rank is not in the tensor's mesh
        return None
    shape, offset = compute_local_shape_and_global_offset(t.shape, mesh, placements)
    # the ranks whose pieces tile the tensor: along the sharded mesh dimensions, this rank's
    # coordinate on the replicated ones (its replica group)
    index = tuple(slice(None) if type(p) is ShardPlacement else c for p, c in zip(placements, coordinate))
    peers = tuple(int(r) for r in mesh.mesh[index].reshape(-1).tolist())
    shape = tuple(int(d) for d in shape)
    return mesh, shape, Shard(tuple(int(d) for d in t.shape), tuple(int(o) for o in offset), shape, peers)


def local_cpu(items: list[tuple[str, torch.Tensor]], copy: bool = True) -> dict[str, "torch.Tensor | tuple"]:
    """CPU copies of named tensors as this rank holds them, in order: a sharded DTensor becomes
    (its local piece, its Shard), with no collective; a replicated one its local (whole) tensor;
    a (piece, Shard) pair stays one.
    Only DTensors whose layout local_piece() cannot express are gathered (gather_full_cpu), and
    every rank decides that alike from the placements, so the collectives still match up."""
    out: dict[str, torch.Tensor | tuple] = {}
    rest = []
    for name, t in items:
        if isinstance(t, tuple):  # already a (piece, Shard) pair (snapshot_piece)
            piece = t
        else:
            piece = local_piece(t) if is_dtensor(t) else None
        if piece is None:
            rest.append((name, t.detach()))
            continue
        local, shard = piece
        local = local.contiguous() if local.device.type == "cpu" and not copy else local.to("cpu", copy=copy).contiguous()
        out[name] = local if shard is None else (local, shard)
    out.update(gather_full_cpu(rest, keep=True, copy=copy))
    return {name: out[name] for name, _ in items}


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


def snapshot_piece(t: torch.Tensor):
    """A copy of a tensor as this rank holds it, taken without DTensor dispatch where it can be: a
    DTensor with a local layout becomes (a copy of its piece, its Shard) - or a copy of its local
    tensor when replicated -, anything else a detached clone (a DTensor still, gathered later)."""
    piece = local_piece(t) if is_dtensor(t) else None
    if piece is None:
        return t.detach().clone()
    local, shard = piece
    return local.clone() if shard is None else (local.clone(), shard)


def minus_piece(current: torch.Tensor, before, name: str):
    """current - before, elementwise, where `before` came from snapshot_piece(): on this rank's
    pieces when it is one (the same values as the whole tensors' difference, without DTensor
    dispatch), else as tensors."""
    if not is_dtensor(current) or is_dtensor(before):
        return current.detach() - before
    piece = local_piece(current)
    shard = before[1] if isinstance(before, tuple) else None
    if piece is None or piece[1] != shard:
        from tracekit.errors import TracekitError

        raise TracekitError(f"the layout of parameter {name!r} changed within a step; tracekit records a fixed layout")
    diff = piece[0] - (before[0] if isinstance(before, tuple) else before)
    return diff if shard is None else (diff, shard)
