"""Format 2 tensors compared region by region from their objects, never more than one piece per
side in memory where both sides share a layout.

A tensor sharded on some side is split into the regions of that side's pieces (the first
sharded side: ref, then cand, then oracle), in order of their offsets; an unsharded tensor of
format 2 stores is one region, its object on each side. Where every side holds exactly those
pieces (the same offsets and shapes: "shared layout") each region is streamed from the objects
in ranges of STREAM_ELEMENTS (the store's PieceReader, store/planner.py, hashes the bytes as they pass, once per
object and open store, and checks hash and finiteness flag before the metrics count), and a
region pair that several rank pairs share (DDP replicas; FSDP, where every rank's tensor is
assembled from the same pieces) is compared once. Where a side is laid out otherwise, that
side's tensor is held whole while the regions are cut out of it: one whole tensor per worker.

Either way the metrics are accumulated per region (flat indices local to the region, renumbered
to the whole tensor's, metrics.MetricsAccumulator.relocate) and merged in region order, so the
report of a tensor is the same whether its regions came from pieces or from a whole tensor.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import threading

import numpy as np

from tracekit.compare.metrics import BLOCK_ELEMENTS, MetricsAccumulator
from tracekit.store.dtypes import to_numpy_values
from tracekit.store.planner import PieceReader, check_piece_flag, prefetch_pieces
from tracekit.store.scratch import Buffers

# Elements read per side at a time: a few metric blocks, small enough to stay in the CPU cache.
STREAM_ELEMENTS = 2 * BLOCK_ELEMENTS

Region = tuple[tuple[int, ...], tuple[int, ...]]  # (offset, shape) in the whole tensor


@dataclass
class SidePlan:
    view: object  # the side's RankView
    info: object  # its TensorInfo
    pieces: dict | None  # region -> Piece where the side holds exactly the plan's regions; None: read whole


@dataclass
class TensorPlan:
    kind: str
    step: int
    shape: tuple[int, ...]
    regions: list[Region]
    sides: list[SidePlan]  # ref, cand[, oracle]
    # the rank whose piece each region is on the side the regions were cut along (None: unsharded):
    # the structured-error fits per shard region (compare/structure.py region_signature)
    owners: list | None = None

    @property
    def shared(self) -> bool:
        return all(s.pieces is not None for s in self.sides)

    def key(self, i: int) -> tuple:
        """What a shared region's comparison depends on: equal keys give equal metrics. The place of
        each side's bytes is part of it: a comparison verifies the places it reads (Verified is
        keyed by hash and place), and each rank pair's check_entries looks up its own places. Equal
        bytes at two places (a DDP replica's tensor packed beside tensors that differ between the
        ranks, so in each rank's own pack) are therefore compared at each, not once."""
        region = self.regions[i]
        return (self.kind, self.shape, region) + tuple(
            (s.pieces[region].place, s.info.dtype) for s in self.sides)

    @property
    def nbytes(self) -> int:
        return sum(s.info.nbytes for s in self.sides)

    def region_nbytes(self, i: int) -> int:
        """The bytes of shared region i's objects, every side."""
        return sum(s.pieces[self.regions[i]].nbytes for s in self.sides)

    def hint(self, i: int) -> None:
        """Start reading shared region i's objects from disk in the background (readahead.py)."""
        prefetch_pieces([s.pieces[self.regions[i]] for s in self.sides])


def is_sharded(infos) -> bool:
    return any(i is not None and i.shard is not None for i in infos)


def plan_tensor(kind: str, step: int, sides: list[tuple[object, object]]) -> TensorPlan:
    """The regions of a tensor, and how each side supplies them. A tensor sharded on some side is
    cut along that side's pieces; an unsharded one (format 2 on every side) is one region, its
    object on each side being the piece."""
    pieces = [view.saved_pieces(kind, step, info.name) for view, info in sides]
    lead = next(p for p, (_, info) in zip(pieces, sides) if info.shard is not None) if is_sharded(
        [i for _, i in sides]) else pieces[0]
    regions = sorted({p.region for p in lead if p.numel > 0})
    plans = []
    for (view, info), ps in zip(sides, pieces):
        by_region = None
        if ps is not None:
            by_region = {p.region: p for p in ps if p.numel > 0}
            if set(by_region) != set(regions):
                by_region = None  # another layout: this side is read whole
        plans.append(SidePlan(view, info, by_region))
    owner = {p.region: p.owner for p in lead if p.numel > 0 and p.info.shard is not None}
    owners = [owner.get(r) for r in regions] if len(regions) > 1 else None
    return TensorPlan(kind, step, tuple(sides[0][1].shape), regions, plans, owners)


def _relocated(plan: TensorPlan, region: Region, acc: MetricsAccumulator) -> MetricsAccumulator:
    offset, shape = region
    if all(o == 0 for o in offset) and tuple(shape) == plan.shape:
        return acc  # the whole tensor: its flat indices already

    def index_of(local: int) -> int:
        where = np.unravel_index(local, shape)
        return int(np.ravel_multi_index(tuple(int(o) + int(w) for o, w in zip(offset, where)), plan.shape))

    return acc.relocate(index_of)


def _region_metrics(plan: TensorPlan, region: Region, bits: list[np.ndarray],
                    new_acc: Callable[[], MetricsAccumulator]) -> MetricsAccumulator:
    vals = [to_numpy_values(b, s.info.dtype) for b, s in zip(bits, plan.sides)]
    acc = new_acc()
    acc.update(vals[0], vals[1], vals[2] if len(vals) > 2 else None)
    return _relocated(plan, region, acc)


_local = threading.local()  # each worker thread's read buffers, reused


def compare_shared_region(plan: TensorPlan, i: int, new_acc) -> MetricsAccumulator:
    """Region i of a shared-layout tensor, streamed from its pieces' objects in ranges of
    STREAM_ELEMENTS (a multiple of the metrics' block, so the sums are those of a whole-piece
    update): every byte is read once, hashed as it passes (objects not yet verified) and compared
    while in the cache. The hashes are checked before the metrics are returned."""
    region = plan.regions[i]
    buffers = _local.__dict__.setdefault("buffers", Buffers())
    readers = []
    try:
        for j, s in enumerate(plan.sides):
            # ref and cand: the metrics count their NaN/Inf exactly, which is their finiteness
            readers.append(PieceReader(plan.kind, plan.step, s.pieces[region], finite_from_caller=j < 2))
        acc = new_acc()
        n = readers[0].piece.numel
        for start in range(0, n, STREAM_ELEMENTS):
            k = min(STREAM_ELEMENTS, n - start)
            vals = [to_numpy_values(r.read(k, buffers.get(slot, r.dtype, k)), s.info.dtype)
                    for slot, r, s in zip(("ref", "cand", "oracle"), readers, plan.sides)]
            acc.update(vals[0], vals[1], vals[2] if len(vals) > 2 else None, offset=start)
        ref_nan, ref_inf, cand_nan, cand_inf = acc.nan_inf
        for j, r in enumerate(readers):
            r.finish((ref_nan + ref_inf == 0, cand_nan + cand_inf == 0, None)[j])
    finally:
        for r in readers:
            r.close()
    return _relocated(plan, region, acc)


def check_entries(plan: TensorPlan) -> None:
    """A shared region's objects were read and verified through one rank pair's index entries;
    a rank pair whose regions came from that comparison checks its own entries' finiteness
    flags against what the verified bytes said (StoreError: damage). Index reads only."""
    for s in plan.sides:
        for p in s.pieces.values():
            check_piece_flag(plan.kind, plan.step, p)


def _whole(plan: TensorPlan, side: SidePlan) -> np.ndarray:
    if side.info.shard is not None:
        return side.view.assemble(plan.kind, plan.step, side.info.name)
    return side.view.read_bits(plan.kind, plan.step, side.info.name).reshape(side.info.shape)


def compare_regions(plan: TensorPlan, new_acc) -> list[MetricsAccumulator]:
    """Every region of a tensor; the sides not laid out like the plan are read whole, one at a time
    per region (a second such side, an oracle, is read whole only after the first is let go)."""
    out = []
    whole_sides = [j for j, s in enumerate(plan.sides) if s.pieces is None]
    held: tuple[int, np.ndarray] | None = None
    for region in plan.regions:
        bits = []
        for j, s in enumerate(plan.sides):
            if s.pieces is not None:
                bits.append(s.view.read_piece(plan.kind, plan.step, s.pieces[region]))
                continue
            if held is None or held[0] != j:
                held = None  # let the previous whole tensor go before reading the next
                held = (j, _whole(plan, s))
            bits.append(np.ascontiguousarray(held[1][tuple(slice(o, o + n) for o, n in zip(*region))]).reshape(-1))
        out.append(_region_metrics(plan, region, bits, new_acc))
        if len(whole_sides) > 1:
            held = None  # two sides read whole (with an oracle): never both at once
    return out


def merged(accs: list[MetricsAccumulator], new_acc, owners: list | None = None) -> MetricsAccumulator:
    """The tensor's metrics: its regions' merged in region order (a fresh accumulator: shared
    region results stay untouched). With `owners` (TensorPlan.owners: each region's rank), each
    region's fit sums are kept too (MetricsAccumulator.regions)."""
    acc = new_acc()
    for a in accs:
        acc.merge(a)
    if owners is not None and len(owners) == len(accs) and None not in owners:
        acc.regions = tuple((int(o), a.fit_sums()) for o, a in zip(owners, accs))
    return acc
