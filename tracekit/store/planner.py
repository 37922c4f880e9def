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
from typing import TYPE_CHECKING

import numpy as np

from tracekit.errors import StoreError
from tracekit.store import io
from tracekit.store.dtypes import storage_dtype
from tracekit.store.format import MAX_CHUNK_BYTES
from tracekit.store.meta import TensorInfo
from tracekit.store.objects import PieceReader, no_bytes  # PieceReader: a piece read in ranges, for streaming readers
from tracekit.store.packs import Located

if TYPE_CHECKING:
    from tracekit.store.reader import RankView

Region = tuple[tuple[int, ...], tuple[int, ...]]  # (offset, shape) in the whole tensor

# The bytes a reader that splits its requests (xarray's dask chunks) best asks for at a time: a
# stored chunk's (format 1's packed rows are chunked at it; the diff splits formats 2-4's rows at it too).
PREFERRED_READ_BYTES = MAX_CHUNK_BYTES


@dataclass(frozen=True)
class Piece:
    """One saved piece of a tensor (format 2 on: a sharded tensor's piece, or an unsharded one's object): the rank view that wrote it, its row there, its
    index entry (entry.shard: where it sits), its content hash and where its bytes lie."""

    view: "RankView"
    row: int
    info: TensorInfo
    digest: bytes
    loc: Located

    @property
    def region(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(offset, shape) in the whole tensor; an unsharded tensor's object is one piece: all of it."""
        if self.info.shard is None:
            return (0,) * len(self.info.shape), tuple(self.info.shape)
        return self.info.shard.offset, self.info.shard.shape

    @property
    def numel(self) -> int:
        return self.info.stored_numel

    @property
    def nbytes(self) -> int:
        return self.info.stored_nbytes

    @property
    def owner(self) -> int:
        """The rank that wrote the piece."""
        return self.view.rank

    @property
    def place(self) -> tuple:
        """What identifies the piece's bytes where they lie (its hash and place: equal places hold
        equal bytes, checked once per open store), opaque to readers."""
        return self.digest, self.loc


def check_piece_flag(kind: str, step: int, piece: Piece) -> None:
    """StoreError (damage) unless the finiteness flag of the piece's index entry says what its
    bytes said when they were verified (read earlier through another rank pair's entries, or
    this one's). RuntimeError if they were not verified yet: index reads only."""
    pv, name = piece.view, piece.info.name
    finite = pv.store.verified.get(piece.digest, piece.loc)
    if finite is None:
        raise RuntimeError("check_piece_flag before the piece's bytes were read")
    pv._check_finite_flag(kind, piece.row, pv.position(kind, name), finite, pv.where(kind, step, name))


def prefetch_pieces(pieces) -> None:
    """Start reading these pieces' objects from disk in the background (a hint, io.prefetch)."""
    for p in pieces:
        if p.info.keeps_bytes:
            io.prefetch(p.view.store.io_root, [(p.loc.key, p.loc.base, p.loc.length)])


@dataclass(frozen=True)
class ReadItem:
    """One saved piece to read for a request: its bytes are `length` bytes of object `key` from
    byte `offset` (length None: the whole object), hashed to `digest`; they hold the tensor's
    `piece` region, of which `overlap` is wanted. `source`: what the format reader checks them
    against (a Piece)."""

    key: str
    offset: int
    length: int | None
    digest: bytes | None
    piece: Region
    overlap: Region
    source: object = None


def item_of(piece, overlap: Region | None = None) -> ReadItem:
    """The ReadItem of a saved piece (a Piece), wanted whole unless `overlap` says."""
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
    pieces = saved_pieces(view, kind, step, name)
    if pieces is None:
        return ReadPlan(kind, step, info, want, (), ranged=True)
    if info.shard is not None:  # before reading: pieces that overlap or leave a gap are damage
        check_tiling(pieces, info.numel, info.shard.peers, view.where(kind, step, name))
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
    fmt = view.store.format
    if len(plan.items) == 1 and plan.items[0].piece == plan.items[0].overlap == plan.region:
        return fmt.fetch(view, plan.kind, plan.step, plan.items[0]).reshape(shape)  # one whole piece: no copy
    out = np.empty(shape, dtype=storage_dtype(info.dtype))
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


def shard_pieces(view, kind: str, step: int, name: str) -> list[Piece]:
    """The pieces of sharded tensor `name` at `step`, each on the rank that wrote it, in peer
    order (StoreError: damage, when a peer's entry does not fit the asking rank's layout)."""
    t = view.tensor(kind, name)
    if t.shard is None:
        raise StoreError(f"rank {view.rank} {kind} tensor {name!r} is not sharded")
    return [Piece(pv, row, info, digest, pv._locations(kind, row)[position])
            for pv, row, info, digest, position in piece_entries(view, kind, step, t)]


def saved_pieces(view, kind: str, step: int, name: str) -> list[Piece] | None:
    """The saved pieces tensor `name` is read from at `step`: a sharded tensor's (on the ranks
    that wrote them, peer order), or an unsharded one's own object as one piece; None where the
    format saves no pieces (format 1: ranges of packed rows, read_span)."""
    t = view.tensor(kind, name)
    if t.shard is not None:
        return shard_pieces(view, kind, step, name)
    piece = view.store.format.whole_piece(view, kind, step, t)
    return None if piece is None else [piece]


# -- which saved pieces a sharded tensor is read from, found a row at a time for every holder of
# a layout (each peer asked through its public API) --

def of_row_pieces(view, what: str, kind: str, step: int, compute) -> dict:
    """{tensor: compute(its pieces)} of every sharded tensor of `kind` at `step`: the same for
    every holder of the layout, so made once per store (under `what`, the step and the layout).
    StoreError (damage) for the first tensor, in index order, whose pieces do not fit."""
    layout = view._layout(kind)
    if not layout:
        return {}

    def make() -> dict:
        found = _row_pieces(view, kind, step, layout)
        return {name: compute(_fitting(view, kind, step, name, found.pieces(name))) for name, _, _, _ in layout}

    return _kept(view, (what, kind, step, id(layout)), make)

def _kept(view, key: tuple, make):
    """The store-wide pieces cache's value under `key`, made by make() the first time."""
    known = view.store.pieces_cache.get(key)
    if known is None:
        known = view.store.pieces_cache[key] = make()
    return known

def piece_entries(view, kind: str, step: int, t: TensorInfo):
    """(peer view, its row, its entry, its digest, its position in the peer's index) of each
    piece of sharded tensor `t` (this rank's entry) at `step`, in peer order; StoreError
    (damage) when a peer's entry does not fit this rank's layout. Every holder of the tensor
    asks the same question: the answers for a whole row are found at once (each peer's index,
    row and hashes looked up once, not once per tensor), and kept once per store."""
    return _fitting(view, kind, step, t.name, _row_pieces(view, kind, step, view._layout(kind)).pieces(t.name))

def _row_pieces(view, kind: str, step: int, layout: tuple) -> "RowPieces":
    return _kept(view, ("pieces", kind, step, id(layout)), lambda: _find_row_pieces(view, kind, step))

def _fitting(view, kind: str, step: int, name: str, got: tuple | str) -> tuple:
    if isinstance(got, str):  # the damage, named here: the message names the asking rank's entry
        raise StoreError(f"damaged store: {view.where(kind, step, name)}: {got}")
    return got

def _find_row_pieces(view, kind: str, step: int) -> "RowPieces":
    """The pieces of every sharded tensor at `step`, or what is wrong with them. A peer's
    problems are checked in the order a reader meets them: the rank is missing, its index is
    unreadable, its entry does not fit, it has no row at the step."""
    layout = view._layout(kind)
    peers: dict[int, object] = {}  # rank -> (its view, its index, ...), or what is wrong with it
    for p in sorted({p for _, ps, _, _ in layout for p in ps}):
        pv = view if p == view.rank else view.store.rank(p) if p in view.store.ranks else None
        if pv is None:
            peers[p] = f"its piece on rank {p} is missing (no rank {p} in the store)"
            continue
        try:
            index = pv._kind_index(kind) if pv.has_kind(kind) else {}
            positions = pv._positions(kind) if index else {}
            # the store's one copy of an equal layout: every entry of this one fits (the usual case)
            fits = bool(index) and pv._layout(kind) is layout
        except StoreError as e:
            peers[p] = f"rank {p}'s index is unreadable ({e})"
            continue
        peers[p] = (pv, index, positions, fits)
    found = RowPieces(layout)

    def slot(p: int, pv: "RankView", index: dict, positions: dict) -> tuple | None:
        # looked up only where a piece needs it: a peer whose entry does not fit is named for that first
        if p not in found.slots:
            row = pv._own_row(kind, step)
            found.slots[p] = None if row is None else (pv, index, positions, row, pv._row_digests(kind, row))
        return found.slots[p]

    for name, tpeers, shape, dtype in layout:
        for p in tpeers:
            peer = peers[p]
            if isinstance(peer, str):
                found.damage[name] = peer
                break
            pv, index, positions, fits = peer
            if not fits:
                info = index.get(name)
                if (info is None or info.shard is None or info.shape != shape or info.dtype != dtype
                        or info.shard.peers != tpeers):
                    found.damage[name] = f"rank {p} holds no matching piece of it"
                    break
            if slot(p, pv, index, positions) is None:
                found.damage[name] = f"rank {p} did not record its piece at this step"
                break
    return found

class RowPieces:
    """The pieces of one row's sharded tensors, as one rank's layout names them (_find_row_pieces):
    what is wrong with a tensor's pieces, and each peer's view, index, positions, row and row hashes,
    from which a tensor's pieces are made when asked. Kept once per store and layout: a tuple per
    piece, made ahead for every tensor, was most of the objects an FSDP diff kept (and so of its
    garbage collector's work)."""

    __slots__ = ("peers_of", "slots", "damage")

    def __init__(self, layout: tuple):
        self.peers_of = {name: tpeers for name, tpeers, _, _ in layout}
        self.slots: dict[int, tuple | None] = {}  # peer -> (view, index, positions, row, row hashes)
        self.damage: dict[str, str] = {}

    def pieces(self, name: str) -> tuple | str:
        """(peer view, its row, its entry, its digest, its position) of each piece, in peer order,
        or what is wrong with them."""
        wrong = self.damage.get(name)
        if wrong is not None:
            return wrong
        out = []
        for p in self.peers_of[name]:
            pv, index, positions, row, digests = self.slots[p]
            position = positions[name]
            out.append((pv, row, index[name], digests[position], position))
        return tuple(out)
