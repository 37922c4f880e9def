"""The read planner: a logical request (rank, kind, step, tensor, optional region) becomes
ReadItems, each one saved piece's bytes (key, offset, length, digest) and the part of the request
it fills; a storage reader (the store's format reader, store/formats/) executes them.

As in PyTorch DCP (create_default_local_load_plan, FileSystemReader.read_data), alignment needs
no layout: the items of a request are the saved pieces that overlap the requested region, whatever
layout wrote them, each read whole and narrowed to the overlap. Consumers ask for regions of
tensors; only the store knows rows, chunks, packs and format versions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from tracekit.errors import StoreError
from tracekit.store.dtypes import storage_dtype
from tracekit.store.objects import no_bytes

Region = tuple[tuple[int, ...], tuple[int, ...]]  # (offset, shape) in the whole tensor


@dataclass(frozen=True)
class ReadItem:
    """One saved piece to read for a request: its bytes are `length` bytes of object `key` from
    byte `offset` (length None: the whole object), hashed to `digest`; they hold the tensor's
    `piece` region, of which `overlap` is wanted. `source`: what the format reader checks them
    against (a store.reader.Piece)."""

    key: str
    offset: int
    length: int | None
    digest: bytes | None
    piece: Region
    overlap: Region
    source: object = None


def item_of(piece, overlap: Region | None = None) -> ReadItem:
    """The ReadItem of a saved piece (store.reader.Piece), wanted whole unless `overlap` says."""
    return ReadItem(piece.loc.key, piece.loc.base, piece.loc.length, piece.digest, piece.region,
                    piece.region if overlap is None else overlap, piece)


def whole(shape) -> Region:
    return (0,) * len(shape), tuple(shape)


def overlap(a: Region, b: Region) -> Region | None:
    """The box both regions cover, or None when they share no element."""
    lo = tuple(max(x, y) for x, y in zip(a[0], b[0]))
    hi = tuple(min(x + n, y + m) for x, n, y, m in zip(a[0], a[1], b[0], b[1]))
    if any(h <= l for l, h in zip(lo, hi)):
        return None
    return lo, tuple(h - l for l, h in zip(lo, hi))


@dataclass(frozen=True)
class ReadPlan:
    """What to read for one request: the items (empty where the format reads the tensor as a
    range of a storage row, `ranged`)."""

    kind: str
    step: int
    info: object  # the requesting rank's TensorInfo
    region: Region
    items: tuple[ReadItem, ...]
    ranged: bool = False


def plan_read(view, kind: str, step: int, name: str, region: Region | None = None) -> ReadPlan:
    """The ReadItems that fill `region` (default: the whole tensor) of tensor `name` as rank
    `view` recorded it at `step`: the saved pieces it overlaps (a sharded tensor's, on the ranks
    that wrote them), or the tensor's own object."""
    info = view.tensor(kind, name)
    want = whole(info.shape) if region is None else (tuple(region[0]), tuple(region[1]))
    if len(want[0]) != len(info.shape) or any(o < 0 or n < 0 or o + n > d for o, n, d in zip(*want, info.shape)):
        raise ValueError(f"region {want} lies outside tensor {name!r} of shape {tuple(info.shape)}")
    if not info.keeps_bytes:
        raise no_bytes(view.where(kind, step, name))
    pieces = view.saved_pieces(kind, step, name)
    if pieces is None:
        return ReadPlan(kind, step, info, want, (), ranged=True)
    if region is None:  # every piece, empty ones too: each is read and checked, as it was recorded
        return ReadPlan(kind, step, info, want, tuple(item_of(p) for p in pieces))
    items = []
    for p in pieces:
        o = overlap(p.region, want)
        if o is not None and all(n > 0 for n in o[1]):
            items.append(item_of(p, o))
    return ReadPlan(kind, step, info, want, tuple(items))


def flat_span(shape, region: Region) -> tuple[int, int]:
    """[start, stop) of the row-major flat elements of a tensor of `shape` that hold `region`."""
    (offset, size) = region
    if not shape:
        return 0, 1
    if math.prod(size) == 0:
        return 0, 0
    last = tuple(o + n - 1 for o, n in zip(offset, size))
    return int(np.ravel_multi_index(offset, shape)), int(np.ravel_multi_index(last, shape)) + 1


def _in_span(flat: np.ndarray, shape, start: int, region: Region) -> np.ndarray:
    """`region` of a tensor of `shape`, from its flat elements [start, ...) in `flat` (a view
    where the region is contiguous: a run of whole rows, the usual request)."""
    (offset, size) = region
    if not shape:
        return flat.reshape(())
    if math.prod(size) == 0:
        return np.empty(size, dtype=flat.dtype)
    partial = [i for i, (n, d) in enumerate(zip(size, shape)) if n != d]
    if not partial or all(n == 1 for n in size[:partial[-1]]):
        return flat[:math.prod(size)].reshape(size)  # contiguous: starts at `start`
    grid = np.ix_(*(np.arange(o, o + n) for o, n in zip(offset, size)))
    return flat[np.ravel_multi_index(grid, shape) - start]


def execute(view, plan: ReadPlan) -> np.ndarray:
    """The requested region, in storage dtype and its shape: each item fetched (checked) by the
    store's format reader, only the flat span of the piece its overlap needs, and the overlap
    copied into place."""
    info, (offset, shape) = plan.info, plan.region
    if plan.ranged:  # a range of a storage row: the flat span the region lies in
        start, stop = flat_span(info.shape, plan.region)
        flat = view.store.format.read_span(view, plan.kind, plan.step, info, start, stop)
        return _in_span(flat, info.shape, start, plan.region)
    out = np.empty(shape, dtype=storage_dtype(info.dtype))
    fmt = view.store.format
    for item in plan.items:
        (po, ps), (qo, qs) = item.piece, item.overlap
        local = (tuple(q - p for q, p in zip(qo, po)), qs)
        span = flat_span(ps, local)
        whole_piece = span == (0, math.prod(ps))
        flat = fmt.fetch(view, plan.kind, plan.step, item, None if whole_piece else span)
        dst = tuple(slice(q - o, q - o + n) for q, o, n in zip(qo, offset, qs))
        out[dst] = _in_span(flat, ps, span[0] if not whole_piece else 0, local)
    return out


def read_flat(view, kind: str, step: int, name: str, start: int = 0, stop: int | None = None) -> np.ndarray:
    """Flat elements [start, stop) of a tensor at a step (default: all), in storage dtype: a
    format that saves it as a range of a storage row reads just those; pieces are read whole."""
    plan = plan_read(view, kind, step, name)
    info = plan.info
    stop = info.numel if stop is None else min(stop, info.numel)
    if plan.ranged:
        return view.store.format.read_span(view, kind, step, info, start, stop)
    flat = execute(view, plan).reshape(-1)
    return flat if (start, stop) == (0, info.numel) else flat[start:stop]


def check_tiling(pieces, numel: int, peers, where: str) -> None:
    """StoreError (damage) unless the pieces tile the tensor: no two overlap and together they
    hold every element (boxes compared pairwise: no mask the size of the tensor)."""
    boxes = [p.region for p in pieces]
    boxes = [b for b in boxes if all(n > 0 for n in b[1])]
    for i, (o1, s1) in enumerate(boxes):
        for o2, s2 in boxes[i + 1:]:
            if all(a < b + m and b < a + n for a, n, b, m in zip(o1, s1, o2, s2)):
                raise StoreError(f"damaged store: {where}: the pieces of ranks {list(peers)} overlap")
    if sum(math.prod(s) for _, s in boxes) != numel:
        raise StoreError(f"damaged store: {where}: the pieces of ranks {list(peers)} do not cover it")
