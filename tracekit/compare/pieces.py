"""Sharded tensors (format 2) compared region by region, one piece at a time.

A sharded tensor is split into the regions of one side's pieces (the first sharded side: ref,
then cand, then oracle), in order of their offsets. Where every side holds exactly those pieces
(the same offsets and shapes: "shared layout") each region is compared from the two pieces alone,
so a worker never holds more than one piece per side, and a region pair that several rank pairs
share (FSDP: every rank's tensor is assembled from the same pieces) is compared once. Where a side
is laid out otherwise, that side's tensor is held whole while the regions are cut out of it: one
whole tensor per worker, never one per side.

Either way the metrics are accumulated per region (flat indices local to the region, renumbered
to the whole tensor's, metrics.MetricsAccumulator.relocate) and merged in region order, so the
report of a tensor is the same whether its regions came from pieces or from a whole tensor.
Every piece read is checked against its hash and finiteness flag (RankView.read_piece).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from tracekit.compare.metrics import MetricsAccumulator
from tracekit.store.dtypes import to_numpy_values

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

    @property
    def shared(self) -> bool:
        return all(s.pieces is not None for s in self.sides)

    def key(self, i: int) -> tuple:
        """What a shared region's comparison depends on: equal keys give equal metrics."""
        region = self.regions[i]
        return (self.kind, self.shape, region) + tuple((s.pieces[region].digest, s.info.dtype) for s in self.sides)

    @property
    def nbytes(self) -> int:
        return sum(s.info.nbytes for s in self.sides)


def is_sharded(infos) -> bool:
    return any(i is not None and i.shard is not None for i in infos)


def plan_tensor(kind: str, step: int, sides: list[tuple[object, object]]) -> TensorPlan:
    """The regions of a tensor sharded on some side, and how each side supplies them."""
    pieces = [view.pieces(kind, step, info.name) if info.shard is not None else None for view, info in sides]
    lead = next(p for p in pieces if p is not None)
    regions = sorted({p.region for p in lead if p.info.shard.numel > 0})
    plans = []
    for (view, info), ps in zip(sides, pieces):
        by_region = None
        if ps is not None:
            by_region = {p.region: p for p in ps if p.info.shard.numel > 0}
            if set(by_region) != set(regions):
                by_region = None  # another layout: this side is read whole
        plans.append(SidePlan(view, info, by_region))
    return TensorPlan(kind, step, tuple(sides[0][1].shape), regions, plans)


def _region_metrics(plan: TensorPlan, region: Region, bits: list[np.ndarray],
                    new_acc: Callable[[], MetricsAccumulator]) -> MetricsAccumulator:
    offset, shape = region
    vals = [to_numpy_values(b, s.info.dtype) for b, s in zip(bits, plan.sides)]
    acc = new_acc()
    acc.update(vals[0], vals[1], vals[2] if len(vals) > 2 else None)

    def index_of(local: int) -> int:
        where = np.unravel_index(local, shape)
        return int(np.ravel_multi_index(tuple(int(o) + int(w) for o, w in zip(offset, where)), plan.shape))

    return acc.relocate(index_of)


def compare_shared_region(plan: TensorPlan, i: int, new_acc) -> MetricsAccumulator:
    """Region i of a shared-layout tensor, from its pieces alone (one piece per side in memory)."""
    region = plan.regions[i]
    bits = [s.view.read_piece(plan.kind, plan.step, s.pieces[region]) for s in plan.sides]
    return _region_metrics(plan, region, bits, new_acc)


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


def merged(accs: list[MetricsAccumulator], new_acc) -> MetricsAccumulator:
    """The tensor's metrics: its regions' merged in region order (a fresh accumulator: shared
    region results stay untouched)."""
    acc = new_acc()
    for a in accs:
        acc.merge(a)
    return acc
