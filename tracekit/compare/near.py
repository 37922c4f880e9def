"""Near matches with the wrong reference value: stale values and swapped data when the candidate
was computed in other arithmetic (an accelerator, bf16, a compiled graph) and so never equals any
reference value bit for bit (compare/matches.py finds the bitwise ones from content hashes).

Only a tensor that fails its own bound at its step, has no exact match, was compared by its bytes
and is small (2 to rows.NUMEL_MAX elements) is looked at; its candidate and the few reference
values it is held against are read once more, after the verdict, at most READ_BUDGET elements per
(step, kind). A reference value is a near match when

- the candidate is within the tensor's own bound (the same rtol/atol/norm rule its comparison
  used) of it, and
- the candidate is at least NEAR_RATIO times closer to it, in the L2 norm of the difference, than
  to the reference at its own step and rank.

The ratio is what keeps a genuine small error from being called stale: a tensor that changes
slowly from step to step (ref[t] ~ ref[t-1]) gives a candidate that errs at t about the same
distance from both, so however its bound falls, no match is taken. An all-zero reference value is
never a match (it says nothing of where the value came from).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np

from tracekit.compare import rows
from tracekit.compare.metrics import MetricsAccumulator
from tracekit.errors import StoreError

NEAR_RATIO = 10.0
READ_BUDGET = 1 << 22  # elements read per (step, kind), both sides together (16 MiB of float32)


@dataclass(frozen=True)
class Near:
    """A near match: the reference value it is closest to, and how close."""

    rel_l2_err: float  # ||cand - matched|| / ||matched||
    closer: float  # ||cand - ref at its own step and rank|| / ||cand - matched||


class NearMatcher:
    """The near-match search of one (step, kind): values read once each, within READ_BUDGET.

    read(view, kind, step, info) -> numpy values of one side's whole tensor; tol(kind, dtype,
    tensor) -> that tensor's own Tolerance (compare/tolerances.py), applied two-way (an --oracle
    verdict has no third value here)."""

    def __init__(self, read: Callable, tol: Callable, equal_nan: bool, ref_catalog, cand_catalog, step: int,
                 kind: str):
        self.read, self.tol, self.equal_nan = read, tol, equal_nan
        self.ref, self.cand = ref_catalog, cand_catalog
        self.step, self.kind = step, kind
        self.budget = READ_BUDGET
        self.cache: dict[tuple, np.ndarray | None] = {}

    def wanted(self, t, result) -> bool:
        n = t.ref.numel
        return (not result.passed and result.metrics.fit is not None and result.metrics.nonfinite == 0
                and 2 <= n <= rows.NUMEL_MAX and result.metrics.fit[2] > 0)

    def stale(self, kp, t, result, offsets) -> tuple[int, Near] | None:
        """(the reference's step, closeness) of the closest near match at step + offset, or None."""
        cand = self._values("cand", kp.rank, self.step, t.cand)
        if cand is None:
            return None
        best = None
        for off in offsets:
            other = self._values("ref", kp.ref_rank, self.step + off, t.ref)
            near = self._near(other, cand, t, result)
            if near is not None and (best is None or near.closer > best[1].closer):
                best = (self.step + off, near)
        return best

    def swapped(self, kp, t, result, others: dict[int, object]) -> list[tuple[int, Near]]:
        """(reference rank, closeness) of every other rank's same tensor the candidate nearly holds.
        others: reference rank -> its TensorInfo of this tensor (unsharded)."""
        cand = self._values("cand", kp.rank, self.step, t.cand)
        if cand is None:
            return []
        out = []
        for q, info in sorted(others.items()):
            if q == kp.ref_rank:
                continue
            near = self._near(self._values("ref", q, self.step, info), cand, t, result)
            if near is not None:
                out.append((q, near))
        return out

    def _near(self, other, cand, t, result) -> Near | None:
        if other is None or other.shape != cand.shape:
            return None
        tol = self.tol(self.kind, t.dtype, t.name)
        acc = MetricsAccumulator(tol.rtol, tol.atol, self.equal_nan, None, tol.rel_l2, tol.elementwise)
        acc.update(other.reshape(-1), cand.reshape(-1))
        m = acc.result(cand.shape)
        if not m.passed or m.nonfinite or acc.ss_ref == 0.0:
            return None  # outside the bound, or an all-zero value (no evidence of where it came from)
        own = math.sqrt(result.metrics.fit[2])
        dist = math.sqrt(acc.ss_diff)
        closer = math.inf if dist == 0 else own / dist
        if closer < NEAR_RATIO:
            return None
        return Near(dist / math.sqrt(acc.ss_ref), closer)

    def _values(self, side: str, rank: int, step: int, info) -> np.ndarray | None:
        key = (side, rank, step, info.name)
        if key in self.cache:
            return self.cache[key]
        value = None
        rc = (self.ref if side == "ref" else self.cand).ranks.get(rank)
        if (rc is not None and self.kind in rc.kinds and rc.kinds[self.kind].has_step(step)
                and info.numel <= self.budget):
            self.budget -= info.numel
            try:
                value = self.read(rc.view, self.kind, step, info)
            except (StoreError, LookupError, ValueError, TypeError, AttributeError):
                value = None  # a format 1 store, or damage that step's own comparison reports
        self.cache[key] = value
        return value
