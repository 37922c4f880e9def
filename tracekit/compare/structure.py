"""Structured errors: an error with a simple shape is a bug, however small; rounding has no shape.

For each (step, kind) the error d = cand - ref is fitted against a scale, d = (k - 1) ref, pooled
over the kind's tensors, per candidate rank and over all ranks. For deltas that is k times the
reference's update (a learning rate off by k - 1); for gradients and outputs a loss or gradient
scale; k near -1 is a sign flip. The fit's significance is z = rho * sqrt(n): rho the correlation
of d with ref (uncentred), n the elements pooled. Rounding noise is uncorrelated with the values it
perturbs, so z stays of order one to a few; a scale error gives rho near 1 even far below the
magnitude bound. A constant shift, d = c, is fitted the same way from the sum of d: its rho is the
mean of d over its root mean square, and it must explain d better than the scale does.

A fit is a signature (a violation, even inside the bounds) when |z| >= Z_MIN and |rho| >= RHO_MIN
and the scale is at least SCALE_FLOOR away from 1 (a shift at least SCALE_FLOOR times the values'
root mean square away from 0):
z alone would grow with n for the faintest systematic correlation of rounding with the values,
rho alone would flag a few elements. Under a precision rule, an outputs or gradients fit smaller
than the compute dtype's unit roundoff that every rank carries the same way is that arithmetic's own
bias, not a signature (bias_floor, COMPUTE_BIASED_KINDS). Replicated kinds (gradients, deltas: the same full tensor on
every data-parallel rank) pool one rank's worth of elements over all ranks, so that copies of one
tensor do not count as independent evidence. A tensor is also fitted on its own (over its ranks)
for a sign flip or a shift, with |rho| >= RHO_TENSOR: one wrong tensor among many is diluted in the
kind's pooled fit. The patterns that need no fit (one rank only, NaN/Inf) are in compare/patterns.py,
the exact and near matches with another step or rank (stale values, swapped shards) in
compare/matches.py and near.py.
Measured thresholds and the clean pairs they were checked on: docs/DIFF.md "Structured errors".
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from tracekit.display import shown
from tracekit.store.kinds import REPLICATED_KINDS

Z_MIN = 20.0
RHO_MIN = 0.05
# A scale closer to 1 than a few float32 roundings is no evidence of a bug: float32 values cannot
# even carry a uniform rescale that small, so such a fit is rounding that happens to correlate with
# the values (seen: fsdp vs hsdp, gradients differing by 1e-8 relative, z = -182 at rho = -0.07).
# The same floor, relative to the values' root mean square, bounds a shift from below.
SCALE_FLOOR = 8 * 2.0 ** -24
# Under a precision rule (compare/precision.py) the kinds whose values the low-precision forward and
# backward computed carry that arithmetic's own bias: a forward in bfloat16 leaves a systematic
# rescale of a fraction of its unit roundoff u in products such as logits (TorchTitan's debug model,
# float32 vs bfloat16: k = 1.00088, 0.23 u, on both ranks, the same under a replay from the float32
# reference). A scale (or a shift, relative to the values' root mean square) of such a kind that is
# smaller than u and that every rank carries the same way is that bias, not evidence of a bug: it is
# rounding-like. Deltas are not among them (the optimizer's float32 update, where an lr error shows),
# and neither is a scale one rank carries alone or ranks carry in opposite directions: every rank
# runs the same arithmetic, so its bias has one sign on all of them.
COMPUTE_BIASED_KINDS = frozenset({"outputs", "gradients"})
Z_QUIET = 5.0  # a rank below this carries no sign of the fit (for "one rank only")
# A single tensor's own fit: its error must be almost all of that shape (rounding never is), since
# the tensors of a step are many chances for one to correlate by luck.
RHO_TENSOR = 0.9
# A fitted scale this close to -1 is a sign flip (cand = -ref): the message says so.
SIGN_FLIP_TOLERANCE = 1e-2
# What a scale of each kind usually is (the message names it); other kinds are not fitted:
# parameters are not proportional to their error (an lr error scales the update: see deltas), a
# scalar loss cannot show a shape.
SCALE_MEANING = {"deltas": "a scale such as the learning rate", "gradients": "a scale such as a loss or gradient scale",
                 "outputs": "a scale of the outputs"}
SHAPES = ("scale", "sign flip", "shift", "stale", "swapped", "one rank", "nonfinite", "permuted rows", "transposed")


@dataclass
class Fit:
    ss_ref: float = 0.0
    dot: float = 0.0
    ss_diff: float = 0.0
    n: int = 0
    sum_diff: float = 0.0

    def add(self, fit: tuple, n: int) -> None:
        self.ss_ref += fit[0]
        self.dot += fit[1]
        self.ss_diff += fit[2]
        self.sum_diff += fit[3] if len(fit) > 3 else 0.0
        self.n += n

    def add_fit(self, other: "Fit") -> None:
        self.add((other.ss_ref, other.dot, other.ss_diff, other.sum_diff), other.n)

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

    # ---- the constant shift: d = c ----
    @property
    def offset(self) -> float:
        """c in cand = ref + c (the least-squares constant: the mean of d)."""
        return self.sum_diff / self.n if self.n else 0.0

    @property
    def rho_shift(self) -> float:
        """The mean of d over its root mean square (the uncentred correlation of d with a constant)."""
        if self.ss_diff <= 0 or self.n == 0:
            return 0.0
        return self.sum_diff / math.sqrt(self.n * self.ss_diff)

    def z_shift(self, copies: int = 1) -> float:
        return self.rho_shift * math.sqrt(self.n / max(copies, 1))

    @property
    def rms_ref(self) -> float:
        """The reference values' root mean square (what a shift is measured against)."""
        return math.sqrt(self.ss_ref / self.n) if self.n and self.ss_ref > 0 else 0.0

    @property
    def relative_offset(self) -> float:
        """The shift over the values' root mean square (inf where the values are all 0)."""
        return self.offset / self.rms_ref if self.rms_ref > 0 else math.inf

    def shift_significant(self, copies: int = 1, rho_min: float = RHO_MIN) -> bool:
        """A shift that explains d better than the scale does (a scale of values with a non-zero
        mean also has a mean error), at least SCALE_FLOOR of the values' root mean square."""
        return (abs(self.z_shift(copies)) >= Z_MIN and abs(self.rho_shift) >= rho_min
                and abs(self.rho_shift) > abs(self.rho) and abs(self.offset) >= SCALE_FLOOR * self.rms_ref)

    @property
    def scale_shape(self) -> str:
        """What a significant scale fit is called: a factor near -1 is a sign flip."""
        return "sign flip" if abs(self.factor + 1.0) <= SIGN_FLIP_TOLERANCE else "scale"

    def sign_flip(self, copies: int = 1, rho_min: float = RHO_MIN) -> bool:
        return (abs(self.z(copies)) >= Z_MIN and self.rho <= -rho_min
                and self.scale_shape == "sign flip")


@dataclass
class Signature:
    """A structured error of one kind at one step."""

    step: int
    kind: str
    shape: str  # one of SHAPES
    factor: float | None  # cand = factor x ref (scale, sign flip)
    z: float | None  # significance of a fit (None: an exact match or a pattern, no fit)
    rho: float | None
    ranks: list[int]  # candidate ranks that carry it
    all_ranks: bool  # every compared rank carries it
    tensors: int  # tensors pooled (or that carry it)
    first_step: int = 0  # the first step this kind showed the same shape (set over the steps)
    example: object = field(default=None, repr=False)  # a TensorResult that carries it (first divergence)
    offset: float | None = None  # cand = ref + offset (shift)
    tensor: str | None = None  # the one tensor a tensor-level shape was found on (else the first of several)
    source_step: int | None = None  # stale: the reference's step the candidate equals
    source_ranks: list | None = None  # swapped: [candidate rank, reference rank whose value it holds]
    detail: str = ""  # a pattern's own words (nonfinite, one rank)
    # a tensor-level shape: every tensor that shows it; an exact match: every (candidate rank, tensor)
    names: list = field(default_factory=list, repr=False)
    # stale, swapped found by near matches (compare/near.py): {"rel_l2_err": the loosest match's error
    # against the value it holds, "closer": the least times it is closer to it than to its own reference}
    near: dict | None = None
    # a scale of the rows (columns, ...) one rank owns in sharded tensors (region_signature), not of
    # that rank's whole tensors: `ranks` are the owners
    shard: bool = False

    @property
    def where(self) -> str:
        if self.shard:
            whose = " and ".join(f"rank {r}'s" for r in self.ranks)
            return f"{whose} shard{'s' if len(self.ranks) > 1 else ''} of {self.tensors} sharded tensors"
        where = "all tensors and ranks" if self.all_ranks else (
            f"rank {self.ranks[0]} only" if len(self.ranks) == 1 else f"ranks {', '.join(map(str, self.ranks))}")
        if self.tensor is not None and self.tensors == 1:
            return f"tensor {shown(self.tensor)}, " + where.replace("all tensors and ranks", "all ranks")
        if self.tensor is not None:
            return f"{self.tensors} tensors ({shown(self.tensor)}, ...), " + where.replace("all tensors and ranks", "all ranks")
        return where

    @property
    def text(self) -> str:
        since = f"from step {self.first_step or self.step}"
        fit = "" if self.z is None else f" (z = {self.z:.0f}, rho = {self.rho:.2f})"
        if self.shape == "scale":
            return (f"systematic: {self.kind} = {self.factor:.4f} x reference{fit} on {self.where}, {since}: "
                    f"{SCALE_MEANING[self.kind]}")
        if self.shape == "sign flip":
            what = "a sign flip of the update" if self.kind == "deltas" else "a sign flip"
            return f"systematic: {self.kind} = {self.factor:.4f} x reference{fit} on {self.where}, {since}: {what}"
        if self.shape == "shift":
            return (f"systematic: {self.kind} = reference {self.offset:+.3g}{fit} on {self.where}, {since}: "
                    "a constant shift")
        if self.shape == "stale":
            how = "exactly" if self.near is None else f"within their bounds ({self._closeness('their own step')})"
            return (f"stale: {self.kind} on {self.where} equal the reference's step {self.source_step} {how}, "
                    f"{since}: an update skipped or a value not refreshed")
        if self.shape == "swapped":
            pairs = ", ".join(f"rank {c} holds rank {r}'s" for c, r in self.source_ranks)
            how = "exactly" if self.near is None else f"within its bound ({self._closeness('its own rank')})"
            return (f"swapped: {self.kind} of {self.where.split(', ')[0] if self.tensor else 'every tensor'}: {pairs} "
                    f"reference value {how}, {since}: shards or data swapped between ranks")
        return f"{self.detail}, {since}"  # one rank, nonfinite, rows: the pattern says it

    def _closeness(self, own: str) -> str:
        closer = self.near["closer"]
        times = "the same values" if closer is None else f"{closer:.0f}x closer than to {own}'s"
        return f"rel L2 err {self.near['rel_l2_err']:.2e}, {times}"

    def to_dict(self) -> dict:
        return {"step": self.step, "kind": self.kind, "shape": self.shape, "factor": self.factor, "z": self.z,
                "rho": self.rho, "offset": self.offset, "ranks": self.ranks, "all_ranks": self.all_ranks,
                "tensors": self.tensors, "tensor": self.tensor, "source_step": self.source_step,
                "source_ranks": self.source_ranks, "near": self.near, "first_step": self.first_step or self.step,
                "text": self.text, **({"shard": True} if self.shard else {})}


@dataclass
class Bias:
    """A fit of one kind at one step that is the compute dtype's own bias (COMPUTE_BIASED_KINDS)."""

    step: int
    shape: str  # "scale" or "shift"
    size: float  # k - 1 of a scale; the offset over the values' root mean square of a shift
    z: float
    floor: float  # the compute dtype's unit roundoff it is under

    def to_dict(self) -> dict:
        return {"step": self.step, "shape": self.shape, "size": self.size, "z": self.z, "floor": self.floor}


@dataclass
class KindShape:
    """The error shape of one kind over the steps compared: the largest |z| of the scale fit seen."""

    kind: str
    max_z: float = 0.0
    differs: bool = False  # some element differed at all
    signatures: list[Signature] = field(default_factory=list)
    bias: Bias | None = None  # the strongest fit taken for the compute dtype's own bias, if any

    def note_bias(self, bias: "Bias | None") -> None:
        if bias is not None and (self.bias is None or abs(bias.z) > abs(self.bias.z)):
            self.bias = bias

    @property
    def shape(self) -> str:
        if self.signatures:
            return "systematic"
        if self.kind not in SCALE_MEANING:
            return "not fitted"
        return "rounding-like" if self.differs else "identical"

    def to_dict(self) -> dict:
        out = {"kind": self.kind, "shape": self.shape, "max_z": self.max_z}
        if self.bias is not None:
            out["bias"] = self.bias.to_dict()
        return out


def bias_floor(kind: str, compute: str | None) -> float:
    """The size under which an all-rank scale or shift of `kind` is the compute dtype's own bias:
    its unit roundoff under a precision rule (COMPUTE_BIASED_KINDS), else 0 (float32: no such floor)."""
    if compute is None or kind not in COMPUTE_BIASED_KINDS:
        return 0.0
    from tracekit.compare.tolerances import UNIT_ROUNDOFF

    return UNIT_ROUNDOFF.get(compute, 0.0)


def _compute_bias(size: float, per_rank: dict[int, Fit], carriers: list[int], floor: float, size_of) -> bool:
    """Whether a fit of `size` carried by `carriers` is the compute dtype's bias: under `floor`,
    carried by every rank, each rank's own fit on the same side (size_of(Fit) -> its size)."""
    if floor <= 0 or abs(size) >= floor or len(carriers) < len(per_rank):
        return False
    signs = {size_of(per_rank[r]) > 0 for r in carriers}
    return len(signs) == 1


def _per_rank(results) -> tuple[dict[int, Fit], set]:
    per_rank: dict[int, Fit] = {}
    tensors = set()
    for r in results:
        fit = r.metrics.fit
        if fit is None:
            continue
        per_rank.setdefault(r.rank, Fit()).add(fit, r.metrics.compared)
        tensors.add(r.tensor)
    return per_rank, tensors


def _carried(fit_of, significant, per_rank: dict[int, Fit], kind: str):
    """(the fit, its z, the ranks that carry it) of the pooled fit or of its strongest ranks, or None.
    fit_of(Fit, copies) -> z; significant(Fit, copies) -> bool."""
    pooled = Fit()
    for f in per_rank.values():
        pooled.add_fit(f)
    copies = len(per_rank) if kind in REPLICATED_KINDS else 1
    strong = sorted(r for r, f in per_rank.items() if significant(f, 1))
    if significant(pooled, copies):
        fit, z = pooled, fit_of(pooled, copies)
        carriers = sorted(r for r, f in per_rank.items() if abs(fit_of(f, 1)) >= Z_QUIET and fit_of(f, 1) * z > 0)
    elif strong:
        r0 = max(strong, key=lambda r: abs(fit_of(per_rank[r], 1)))
        fit, z = per_rank[r0], fit_of(per_rank[r0], 1)
        carriers = strong
    else:
        return None
    quiet = all(abs(fit_of(per_rank[r], 1)) < Z_QUIET for r in per_rank if r not in carriers)
    if not quiet:  # some ranks carry it only faintly: say every rank that shows it, not "only"
        carriers = sorted(r for r, f in per_rank.items() if abs(fit_of(f, 1)) >= Z_QUIET) or carriers
    carriers = carriers or sorted(per_rank)
    if len(carriers) < len(per_rank):  # the fit of the ranks that carry it: the others would dilute it
        fit = Fit()
        for r in carriers:
            fit.add_fit(per_rank[r])
        z = fit_of(fit, len(carriers) if kind in REPLICATED_KINDS else 1)
    return fit, z, carriers


def _example(results, carriers, tensor=None):
    return max((r for r in results if r.rank in carriers and r.metrics.fit is not None
                and (tensor is None or r.tensor == tensor)), key=lambda r: r.metrics.fit[2])


def step_signature(step: int, kind: str, results, floor: float = 0.0,
                   biases: list | None = None) -> tuple[Signature | None, float, bool]:
    """(the scale signature of one kind at one step or None, the largest |z| of its fits, whether
    anything differed). A scale near -1 is named a sign flip. A scale under `floor` (bias_floor) on
    every rank the same way is no signature: it is appended to `biases` as a Bias."""
    if kind not in SCALE_MEANING:
        return None, 0.0, any((r.metrics.fit or (0, 0, 0))[2] > 0 for r in results)
    per_rank, tensors = _per_rank(results)
    if not per_rank:
        return None, 0.0, False
    differs = any(f.ss_diff > 0 for f in per_rank.values())
    copies = len(per_rank) if kind in REPLICATED_KINDS else 1
    pooled = Fit()
    for f in per_rank.values():
        pooled.add_fit(f)
    max_z = max([abs(pooled.z(copies))] + [abs(f.z()) for f in per_rank.values()])
    got = _carried(lambda f, c: f.z(c), lambda f, c: f.significant(c), per_rank, kind)
    if got is None:
        return None, max_z, differs
    fit, z, carriers = got
    if _compute_bias(fit.factor - 1.0, per_rank, carriers, floor, lambda f: f.factor - 1.0):
        if biases is not None:
            biases.append(Bias(step, "scale", fit.factor - 1.0, z, floor))
        return None, max_z, differs
    sig = Signature(step, kind, fit.scale_shape, fit.factor, z, fit.rho, carriers, len(carriers) == len(per_rank), len(tensors),
                    example=_example(results, carriers))
    return sig, max_z, differs


def shift_signature(step: int, kind: str, results, floor: float = 0.0, biases: list | None = None) -> Signature | None:
    """The constant-shift signature of one kind at one step, pooled over its tensors, or None (also
    for a shift under `floor` of the values' root mean square on every rank the same way: a Bias)."""
    if kind not in SCALE_MEANING:
        return None
    per_rank, tensors = _per_rank(results)
    if not per_rank:
        return None
    got = _carried(lambda f, c: f.z_shift(c), lambda f, c: f.shift_significant(c), per_rank, kind)
    if got is None:
        return None
    fit, z, carriers = got
    if _compute_bias(fit.relative_offset, per_rank, carriers, floor, lambda f: f.offset):
        if biases is not None:
            biases.append(Bias(step, "shift", fit.relative_offset, z, floor))
        return None
    return Signature(step, kind, "shift", None, z, fit.rho_shift, carriers, len(carriers) == len(per_rank),
                     len(tensors), example=_example(results, carriers), offset=fit.offset)


def region_signature(step: int, kind: str, results, floor: float = 0.0) -> Signature | None:
    """A scale of the elements one rank owns in the kind's sharded tensors (FSDP2's rows), pooled
    over the tensors per owner (metrics.regions), that the whole tensors' fit does not see: every
    rank holds the same assembled tensor, and a fault of one rank's shard that a later step undoes
    in total (TorchTitan clips the gradients to a norm: rank 1's rows come out scaled up, rank 0's
    down) leaves no scale over the whole. A signature when some owners' fits are significant (and,
    under a precision rule, at least `floor` from 1) but not every owner's the same way (that is
    the whole tensors' scale, which step_signature says)."""
    if kind not in SCALE_MEANING:
        return None
    per_owner: dict[int, Fit] = {}
    tensors, seen = set(), set()
    for r in results:
        for owner, sums in r.metrics.regions or ():
            if (r.tensor, owner) in seen:  # every rank assembled from the same pieces: one copy counts
                continue
            seen.add((r.tensor, owner))
            per_owner.setdefault(owner, Fit()).add(sums[:4], sums[4])
            tensors.add(r.tensor)
    if len(per_owner) < 2:
        return None
    strong = {o: f for o, f in per_owner.items() if f.significant() and abs(f.factor - 1.0) >= floor}
    if not strong:
        return None
    up = {o for o, f in strong.items() if f.factor > 1.0}
    if len(strong) == len(per_owner) and up in (set(), set(strong)):
        return None  # every owner the same way: a scale of the whole tensors
    r0 = max(strong, key=lambda o: abs(strong[o].z()))
    carriers = sorted(o for o in strong if (o in up) == (r0 in up))
    fit = Fit()
    for o in carriers:
        fit.add_fit(per_owner[o])
    mine = [r for r in results if r.metrics.regions and r.metrics.fit is not None]
    example = max(mine, key=lambda r: r.metrics.fit[2]) if mine else next(r for r in results if r.metrics.regions)
    return Signature(step, kind, fit.scale_shape, fit.factor, fit.z(), fit.rho, carriers, False, len(tensors),
                     example=example, shard=True)


def tensor_signatures(step: int, kind: str, results, taken: set[str] = frozenset()) -> list[Signature]:
    """One tensor's own sign flip or shift (over its ranks), except the shapes in `taken`.
    Tensors with the same shape make one signature (`names`: all of them)."""
    if kind not in SCALE_MEANING:
        return []
    ranks_all = {r.rank for r in results}
    by_tensor: dict[str, list] = {}
    for r in results:
        by_tensor.setdefault(r.tensor, []).append(r)
    found: dict[str, list] = {}  # shape -> [(tensor, fit, z, ranks)]
    for name, rs in by_tensor.items():
        per_rank, _ = _per_rank(rs)
        if not per_rank:
            continue
        for shape, fit_of, significant in (
                ("sign flip", lambda f, c: f.z(c), lambda f, c: f.sign_flip(c, RHO_TENSOR)),
                ("shift", lambda f, c: f.z_shift(c), lambda f, c: f.shift_significant(c, RHO_TENSOR))):
            if shape in taken:
                continue
            got = _carried(fit_of, significant, per_rank, kind)
            if got is not None:
                found.setdefault(shape, []).append((name, *got))
                break
    out = []
    for shape, hits in found.items():
        name, fit, z, carriers = max(hits, key=lambda h: abs(h[2]))
        ranks = sorted({r for h in hits for r in h[3]})
        out.append(Signature(step, kind, shape, fit.factor if shape == "sign flip" else None, z,
                             fit.rho if shape == "sign flip" else fit.rho_shift, ranks, set(ranks) == ranks_all,
                             len(hits), example=_example(results, carriers, name),
                             offset=fit.offset if shape == "shift" else None, tensor=name,
                             names=[h[0] for h in hits]))
    return out


def first_steps(signatures: list[Signature]) -> None:
    """Set each signature's first_step: the earliest step of an unbroken run of the same kind, shape
    (and tensor), ranks and direction (factor above or below 1, shift up or down) leading up to it."""
    last: dict[tuple, Signature] = {}
    for s in sorted(signatures, key=lambda s: s.step):
        prev = last.get((s.kind, s.shape, s.tensor))
        same = prev is not None and prev.ranks == s.ranks and _direction(prev) == _direction(s)
        s.first_step = prev.first_step if same else s.step
        last[(s.kind, s.shape, s.tensor)] = s


def _direction(s: Signature) -> tuple:
    return (None if s.factor is None else s.factor > 1, None if s.offset is None else s.offset > 0)
