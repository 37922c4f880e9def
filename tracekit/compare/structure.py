"""Structured errors: an error with a simple shape is a bug, however small; rounding has no shape.

For each (step, kind) the error d = cand - ref is fitted against a scale, d = (k - 1) ref, pooled
over the kind's tensors, per candidate rank and over all ranks. For deltas that is k times the
reference's update (a learning rate off by k - 1); for gradients and outputs a loss or gradient
scale. The fit's significance is z = rho * sqrt(n): rho the correlation of d with ref (uncentred),
n the elements pooled. Rounding noise is uncorrelated with the values it perturbs, so z stays of
order one to a few; a scale error gives rho near 1 even far below the magnitude bound.

A fit is a signature (a violation, even inside the bounds) when |z| >= Z_MIN and |rho| >= RHO_MIN
and the scale is at least SCALE_FLOOR away from 1:
z alone would grow with n for the faintest systematic correlation of rounding with the values,
rho alone would flag a few elements. Replicated kinds (gradients, deltas: the same full tensor on
every data-parallel rank) pool one rank's worth of elements over all ranks, so that copies of one
tensor do not count as independent evidence. Measured thresholds and the clean pairs they were
checked on: docs/DIFF.md "Structured errors".
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from tracekit.store.kinds import REPLICATED_KINDS

Z_MIN = 20.0
RHO_MIN = 0.05
# A scale closer to 1 than a few float32 roundings is no evidence of a bug: float32 values cannot
# even carry a uniform rescale that small, so such a fit is rounding that happens to correlate with
# the values (seen: fsdp vs hsdp, gradients differing by 1e-8 relative, z = -182 at rho = -0.07).
SCALE_FLOOR = 8 * 2.0 ** -24
Z_QUIET = 5.0  # a rank below this carries no sign of the fit (for "one rank only")
# What a scale of each kind usually is (the message names it); other kinds are not fitted:
# parameters are not proportional to their error (an lr error scales the update: see deltas), a
# scalar loss cannot show a shape.
SCALE_MEANING = {"deltas": "a scale such as the learning rate", "gradients": "a scale such as a loss or gradient scale",
                 "outputs": "a scale of the outputs"}


@dataclass
class Fit:
    ss_ref: float = 0.0
    dot: float = 0.0
    ss_diff: float = 0.0
    n: int = 0

    def add(self, fit: tuple[float, float, float], n: int) -> None:
        self.ss_ref += fit[0]
        self.dot += fit[1]
        self.ss_diff += fit[2]
        self.n += n

    @property
    def rho(self) -> float:
        if self.ss_ref <= 0 or self.ss_diff <= 0:
            return 0.0
        return self.dot / math.sqrt(self.ss_ref * self.ss_diff)

    def z(self, copies: int = 1) -> float:
        return self.rho * math.sqrt(self.n / max(copies, 1))

    @property
    def factor(self) -> float:
        """k in cand = k * ref (the least-squares scale)."""
        return 1.0 + (self.dot / self.ss_ref if self.ss_ref > 0 else 0.0)

    def significant(self, copies: int = 1) -> bool:
        return (abs(self.z(copies)) >= Z_MIN and abs(self.rho) >= RHO_MIN
                and abs(self.factor - 1.0) >= SCALE_FLOOR)


@dataclass
class Signature:
    """A structured error of one kind at one step."""

    step: int
    kind: str
    shape: str  # "scale"
    factor: float  # cand = factor x ref
    z: float
    rho: float
    ranks: list[int]  # candidate ranks that carry it
    all_ranks: bool  # every compared rank carries it
    tensors: int  # tensors pooled
    first_step: int = 0  # the first step this kind showed the same shape (set over the steps)
    example: object = field(default=None, repr=False)  # a TensorResult that carries it (first divergence)

    @property
    def text(self) -> str:
        where = "all tensors and ranks" if self.all_ranks else (
            f"rank {self.ranks[0]} only" if len(self.ranks) == 1 else f"ranks {', '.join(map(str, self.ranks))}")
        return (f"systematic: {self.kind} = {self.factor:.4f} x reference (z = {self.z:.0f}, rho = {self.rho:.2f}) "
                f"on {where}, from step {self.first_step or self.step}: {SCALE_MEANING[self.kind]}")

    def to_dict(self) -> dict:
        return {"step": self.step, "kind": self.kind, "shape": self.shape, "factor": self.factor, "z": self.z,
                "rho": self.rho, "ranks": self.ranks, "all_ranks": self.all_ranks, "tensors": self.tensors,
                "first_step": self.first_step or self.step, "text": self.text}


@dataclass
class KindShape:
    """The error shape of one kind over the steps compared: the largest |z| of the scale fit seen."""

    kind: str
    max_z: float = 0.0
    differs: bool = False  # some element differed at all
    signatures: list[Signature] = field(default_factory=list)

    @property
    def shape(self) -> str:
        if self.kind not in SCALE_MEANING:
            return "not fitted"
        if self.signatures:
            return "systematic"
        return "rounding-like" if self.differs else "identical"

    def to_dict(self) -> dict:
        return {"kind": self.kind, "shape": self.shape, "max_z": self.max_z}


def step_signature(step: int, kind: str, results) -> tuple[Signature | None, float, bool]:
    """(the signature of one kind at one step or None, the largest |z| of its fits, whether anything differed)."""
    if kind not in SCALE_MEANING:
        return None, 0.0, any((r.metrics.fit or (0, 0, 0))[2] > 0 for r in results)
    per_rank: dict[int, Fit] = {}
    tensors = set()
    for r in results:
        fit = r.metrics.fit
        if fit is None:
            continue
        per_rank.setdefault(r.rank, Fit()).add(fit, r.metrics.compared)
        tensors.add(r.tensor)
    if not per_rank:
        return None, 0.0, False
    differs = any(f.ss_diff > 0 for f in per_rank.values())
    pooled = Fit()
    for f in per_rank.values():
        pooled.add((f.ss_ref, f.dot, f.ss_diff), f.n)
    copies = len(per_rank) if kind in REPLICATED_KINDS else 1
    max_z = max([abs(pooled.z(copies))] + [abs(f.z()) for f in per_rank.values()])
    strong = sorted(r for r, f in per_rank.items() if f.significant())
    if pooled.significant(copies):
        fit, z = pooled, pooled.z(copies)
        carriers = sorted(r for r, f in per_rank.items() if abs(f.z()) >= Z_QUIET and f.rho * fit.rho > 0)
    elif strong:
        r0 = max(strong, key=lambda r: abs(per_rank[r].z()))
        fit, z = per_rank[r0], per_rank[r0].z()
        carriers = strong
    else:
        return None, max_z, differs
    quiet = all(abs(per_rank[r].z()) < Z_QUIET for r in per_rank if r not in carriers)
    if not quiet:  # some ranks carry it only faintly: say every rank that shows it, not "only"
        carriers = sorted(r for r, f in per_rank.items() if abs(f.z()) >= Z_QUIET) or carriers
    carriers = carriers or sorted(per_rank)
    if len(carriers) < len(per_rank):  # the fit of the ranks that carry it: the others would dilute k
        fit = Fit()
        for r in carriers:
            f = per_rank[r]
            fit.add((f.ss_ref, f.dot, f.ss_diff), f.n)
        z = fit.z(len(carriers) if kind in REPLICATED_KINDS else 1)
    example = max((r for r in results if r.rank in carriers and r.metrics.fit is not None),
                  key=lambda r: r.metrics.fit[2])
    sig = Signature(step, kind, "scale", fit.factor, z, fit.rho, carriers, len(carriers) == len(per_rank), len(tensors),
                    example=example)
    return sig, max_z, differs


def first_steps(signatures: list[Signature]) -> None:
    """Set each signature's first_step: the earliest step of an unbroken run of the same kind, shape
    and direction (factor above or below 1) leading up to it."""
    by_kind: dict[str, list[Signature]] = {}
    for s in sorted(signatures, key=lambda s: s.step):
        run = by_kind.setdefault(s.kind, [])
        prev = run[-1] if run else None
        same = prev is not None and (prev.factor > 1) == (s.factor > 1) and prev.ranks == s.ranks
        s.first_step = prev.first_step if same else s.step
        run.append(s)
