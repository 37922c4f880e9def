"""Which recorded tensors are compared with which: the alignment modes and structural problems.

  rank    ref rank R with cand rank R (the default).
  coords  by mesh coordinates (dp rank, tp rank, ...), for runs whose rank order differs.
  global  layout-free: every candidate rank's full tensor against the reference's full tensor of
          the same step, whatever the number of ranks or the parallel layout. Kinds whose value
          depends on the data shard a rank saw (outputs, local_loss) pair ranks with the same
          data-parallel rank, and are "not comparable" when the data-parallel degrees differ.

Anything present on one side only, and shape or dtype mismatches, become StructuralProblems;
the comparison plan keeps only what both sides have.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tracekit.compare.options import ALIGN_MODES
from tracekit.compare.catalog import RankCatalog, StoreCatalog
from tracekit.compare.tolerances import coarser_dtype, real_float
from tracekit.errors import UsageError
from tracekit.store import TensorInfo
from tracekit.store.kinds import LAYOUT_DEPENDENT_KINDS, REPLICATED_KINDS, kind_order

# LAYOUT_DEPENDENT_KINDS: per data shard (each data-parallel rank sees its own slice of the batch);
# REPLICATED_KINDS: full tensors on every rank. Both come from the kind registry.


@dataclass(frozen=True, slots=True)
class TensorPair:
    name: str
    ref: TensorInfo
    cand: TensorInfo
    oracle: TensorInfo | None = None

    @property
    def dtype(self) -> str:
        """The dtype the pair is judged in: both sides' when equal; for floats stored in different
        widths (a float32 reference, a bfloat16 candidate), the coarser one's bounds apply."""
        return coarser_dtype(self.ref.dtype, self.cand.dtype)


# Two sides that store one tensor in different float widths are compared as values (each decoded to
# numpy exactly), under the coarser width's bounds (tolerances.coarser_dtype: the larger unit
# roundoff): the accelerator's bfloat16 output against the CPU reference's float32 one is the case
# this is for.


@dataclass
class KindPair:
    """One kind of one candidate rank, paired with a reference (and oracle) rank."""

    kind: str
    rank: int  # candidate rank: the rank reports name
    ref_rank: int
    oracle_rank: int | None
    tensors: list[TensorPair]
    steps: list[int]
    key: int = -1  # its place in the plan's pairs (set by plan()): what results of it are kept under


@dataclass
class StructuralProblem:
    problem: str  # missing_rank, missing_kind, missing_steps, missing_tensor, shape_mismatch, dtype_mismatch
    side: str | None  # the side that lacks something ("ref", "cand", "oracle"); None for mismatches
    message: str
    ranks: list[int] = field(default_factory=list)  # ranks of `side` (candidate ranks for mismatches)
    kinds: list[str] = field(default_factory=list)
    steps: list[int] = field(default_factory=list)
    tensor: str | None = None

    def to_dict(self) -> dict:
        return {"problem": self.problem, "side": self.side, "message": self.message, "ranks": self.ranks,
                "kinds": self.kinds, "steps": self.steps, "tensor": self.tensor}


@dataclass(frozen=True)
class NotComparable:
    kind: str
    tensor: str | None
    reason: str

    def to_dict(self) -> dict:
        return {"kind": self.kind, "tensor": self.tensor, "reason": self.reason}


@dataclass
class Plan:
    align: str
    pairs: list[KindPair]
    structural: list[StructuralProblem]
    not_comparable: list[NotComparable]
    ranks: list[int]  # candidate ranks compared
    mixed_dtypes: list[StructuralProblem] = field(default_factory=list)  # float tensors stored in other widths


def ranges(values) -> str:
    """[0, 1, 2, 5] -> '0-2,5'."""
    vals = sorted(set(values))
    out, i = [], 0
    while i < len(vals):
        j = i
        while j + 1 < len(vals) and vals[j + 1] == vals[j] + 1:
            j += 1
        out.append(str(vals[i]) if i == j else f"{vals[i]}-{vals[j]}")
        i = j + 1
    return ",".join(out)


class _Problems:
    """Collects raw problems and groups the repeats (same problem on many ranks, kinds or steps)."""

    def __init__(self):
        self.raw: list[tuple] = []

    def add(self, problem, side, rank, kind=None, tensor=None, steps=(), detail=""):
        self.raw.append((problem, side, rank, kind, tensor, tuple(steps), detail))

    def grouped(self) -> list[StructuralProblem]:
        by_rank: dict[tuple, list[int]] = {}
        for problem, side, rank, kind, tensor, steps, detail in self.raw:
            key = (problem, side, kind, tensor, steps, detail)
            if rank not in by_rank.setdefault(key, []):
                by_rank[key].append(rank)
        by_kind: dict[tuple, list[str]] = {}
        for (problem, side, kind, tensor, steps, detail), rks in by_rank.items():
            key = (problem, side, tensor, steps, detail, tuple(sorted(rks)))
            if kind is not None and kind not in by_kind.setdefault(key, []):
                by_kind[key].append(kind)
            by_kind.setdefault(key, [])
        out = []
        for (problem, side, tensor, steps, detail, rks), kinds in by_kind.items():
            kinds = sorted(kinds, key=lambda k: (kind_order(k), k))
            out.append(StructuralProblem(problem, side, _message(problem, side, list(rks), kinds, list(steps), tensor, detail),
                                         list(rks), kinds, list(steps), tensor))
        order = ["missing_rank", "missing_kind", "missing_steps", "missing_tensor", "shape_mismatch", "dtype_mismatch",
                 "dtype_differs"]
        return sorted(out, key=lambda p: (order.index(p.problem), p.side or "", p.ranks, p.steps))

    def split(self) -> tuple[list[StructuralProblem], list[StructuralProblem]]:
        """(the structural problems, the float tensors compared across storage widths: not problems)."""
        grouped = self.grouped()
        return [p for p in grouped if p.problem != "dtype_differs"], [p for p in grouped if p.problem == "dtype_differs"]


def _message(problem, side, ranks, kinds, steps, tensor, detail) -> str:
    rk = f"rank{'s' if len(ranks) > 1 else ''} {ranges(ranks)}"
    kd = ", ".join(kinds)
    if problem == "missing_rank":
        return f"{side} lacks {rk}{detail}"
    if problem == "missing_kind":
        return f"{side} {rk} recorded no {kd}"
    if problem == "missing_steps":
        other = "the other side" if side == "oracle" else ("cand" if side == "ref" else "ref")
        return f"{side} {rk} lack{'s' if len(ranks) == 1 else ''} step{'s' if len(steps) > 1 else ''} {ranges(steps)} of {kd} (present in {other})"
    if problem == "missing_tensor":
        return f"{side} lacks {kd} tensor {tensor!r} ({rk})"
    return f"{kd} tensor {tensor!r}: {detail} ({rk})"


def coords_key(rc: RankCatalog) -> tuple:
    """A rank's position in the device mesh, independent of its rank number."""
    c = rc.coords
    if c.meshes:
        return tuple((m.dim_names, m.coordinate) for m in c.meshes)
    return tuple(sorted(c.positions().items()))


def _show_key(key: tuple) -> str:
    if key and isinstance(key[0][0], tuple):  # meshes
        return " ".join(",".join(f"{n}={v}" for n, v in zip(names, coord)) for names, coord in key)
    return ",".join(f"{k}={v}" for k, v in key)


def _index_by_coords(cat: StoreCatalog, role: str) -> dict[tuple, RankCatalog]:
    out: dict[tuple, RankCatalog] = {}
    for rc in cat.ranks.values():
        key = coords_key(rc)
        if not key:
            raise UsageError(f"--align coords: {role} {cat.path} rank {rc.rank} has no mesh coordinates recorded")
        if key in out:
            raise UsageError(
                f"--align coords: {role} ranks {out[key].rank} and {rc.rank} have the same coordinates ({_show_key(key)})"
            )
        out[key] = rc
    return out


def _pair_tensors(kind, ref_rc, cand_rc, oracle_rc, problems, cand_rank):
    """Match the tensors of one kind by name; problems for what differs."""
    rk, ck = ref_rc.kinds[kind], cand_rc.kinds[kind]
    ok = oracle_rc.kinds.get(kind) if oracle_rc is not None else None
    pairs = []
    for name in ck.tensors.keys() - rk.tensors.keys():
        problems.add("missing_tensor", "ref", ref_rc.rank, kind, name)
    for name, rt in rk.tensors.items():
        ct = ck.tensors.get(name)
        if ct is None:
            problems.add("missing_tensor", "cand", cand_rank, kind, name)
            continue
        if rt.shape != ct.shape:
            problems.add("shape_mismatch", None, cand_rank, kind, name, detail=f"shape {rt.shape} in ref, {ct.shape} in cand")
            continue
        if rt.dtype != ct.dtype and real_float(rt.dtype) and real_float(ct.dtype):
            problems.add("dtype_differs", None, cand_rank, kind, name,
                         detail=f"{rt.dtype} in ref, {ct.dtype} in cand: compared as values under {coarser_dtype(rt.dtype, ct.dtype)} bounds")
        elif rt.dtype != ct.dtype:
            problems.add("dtype_mismatch", None, cand_rank, kind, name, detail=f"dtype {rt.dtype} in ref, {ct.dtype} in cand")
            continue
        ot = None
        if oracle_rc is not None:
            ot = ok.tensors.get(name) if ok is not None else None
            if ot is None:
                problems.add("missing_tensor", "oracle", oracle_rc.rank, kind, name)
                continue
            if ot.shape != rt.shape:
                problems.add("shape_mismatch", None, cand_rank, kind, name, detail=f"shape {rt.shape} in ref, {ot.shape} in oracle")
                continue
        pairs.append(TensorPair(name, rt, ct, ot))
    return pairs


def _pair_steps(kind, ref_rc, cand_rc, oracle_rc, problems, cand_rank):
    rs, cs = set(ref_rc.kinds[kind].steps), set(cand_rc.kinds[kind].steps)
    if cs - rs:
        problems.add("missing_steps", "ref", ref_rc.rank, kind, steps=sorted(cs - rs))
    if rs - cs:
        problems.add("missing_steps", "cand", cand_rank, kind, steps=sorted(rs - cs))
    common = rs & cs
    if oracle_rc is not None:
        os_ = set(oracle_rc.kinds[kind].steps) if kind in oracle_rc.kinds else set()
        if common - os_:
            problems.add("missing_steps", "oracle", oracle_rc.rank, kind, steps=sorted(common - os_))
        common &= os_
    return sorted(common)


def _make_pair(kind, ref_rc, cand_rc, oracle_rc, problems) -> KindPair | None:
    if kind not in ref_rc.kinds:
        problems.add("missing_kind", "ref", ref_rc.rank, kind)
        return None
    if kind not in cand_rc.kinds:
        problems.add("missing_kind", "cand", cand_rc.rank, kind)
        return None
    if oracle_rc is not None and kind not in oracle_rc.kinds:
        problems.add("missing_kind", "oracle", oracle_rc.rank, kind)
        return None
    tensors = _pair_tensors(kind, ref_rc, cand_rc, oracle_rc, problems, cand_rc.rank)
    steps = _pair_steps(kind, ref_rc, cand_rc, oracle_rc, problems, cand_rc.rank)
    return KindPair(kind, cand_rc.rank, ref_rc.rank, None if oracle_rc is None else oracle_rc.rank, tensors, steps)


def _all_kinds(cats, kinds) -> list[str]:
    present = {k for cat in cats for rc in cat.ranks.values() for k in rc.kinds}
    if kinds is not None:
        unknown = [k for k in kinds if k not in present]
        if unknown:
            raise UsageError(f"--kinds: no store has {', '.join(unknown)} (recorded: {', '.join(sorted(present))})")
        present = set(kinds)
    return sorted(present, key=lambda k: (kind_order(k), k))


def plan(ref: StoreCatalog, cand: StoreCatalog, oracle: StoreCatalog | None = None, align: str = "rank",
         kinds: list[str] | None = None) -> Plan:
    if align not in ALIGN_MODES:
        raise UsageError(f"unknown alignment {align!r}; choose one of {', '.join(ALIGN_MODES)}")
    kinds = _all_kinds([c for c in (ref, cand) if c is not None], kinds)
    problems = _Problems()
    if align == "global":
        pairs, not_comparable = _plan_global(ref, cand, oracle, kinds, problems)
        ranks = sorted(cand.ranks)
    else:
        not_comparable = []
        rank_pairs = _rank_pairs(ref, cand, oracle, align, problems)
        pairs = []
        for rrc, crc, orc in rank_pairs:
            for kind in kinds:
                kinds_here = set(rrc.kinds) | set(crc.kinds)
                if kind not in kinds_here:
                    continue
                kp = _make_pair(kind, rrc, crc, orc, problems)
                if kp is not None:
                    pairs.append(kp)
        ranks = sorted(c.rank for _, c, _ in rank_pairs)
    structural, mixed = problems.split()
    for i, kp in enumerate(pairs):
        kp.key = i
    return Plan(align, pairs, structural, not_comparable, ranks, mixed)


def _rank_pairs(ref, cand, oracle, align, problems):
    if align == "rank":
        rkeys = {r: rc for r, rc in ref.ranks.items()}
        ckeys = {r: rc for r, rc in cand.ranks.items()}
        okeys = None if oracle is None else dict(oracle.ranks)
        show = lambda k: ""  # noqa: E731
    else:
        rkeys, ckeys = _index_by_coords(ref, "ref"), _index_by_coords(cand, "cand")
        okeys = None if oracle is None else _index_by_coords(oracle, "oracle")
        show = lambda k: f" at {_show_key(k)}"  # noqa: E731
    out = []
    for key, rrc in rkeys.items():
        crc = ckeys.get(key)
        if crc is None:
            problems.add("missing_rank", "cand", rrc.rank, detail=show(key) + (f" (ref rank {rrc.rank})" if align == "coords" else ""))
            continue
        orc = None
        if okeys is not None:
            orc = okeys.get(key)
            if orc is None:
                problems.add("missing_rank", "oracle", rrc.rank, detail=show(key))
                continue
        out.append((rrc, crc, orc))
    for key, crc in ckeys.items():
        if key not in rkeys:
            problems.add("missing_rank", "ref", crc.rank, detail=show(key) + (f" (cand rank {crc.rank})" if align == "coords" else ""))
    return sorted(out, key=lambda t: t[1].rank)


def _plan_global(ref, cand, oracle, kinds, problems):
    pairs: list[KindPair] = []
    not_comparable: list[NotComparable] = []
    for kind in kinds:
        holders = {}
        for role, cat in (("ref", ref), ("cand", cand), ("oracle", oracle)):
            if cat is None:
                continue
            have = [rc for rc in cat.ranks.values() if kind in rc.kinds]
            lack = [rc.rank for rc in cat.ranks.values() if kind not in rc.kinds]
            for r in lack:
                problems.add("missing_kind", role, r, kind)
            holders[role] = have
        if not holders["ref"] or not holders["cand"] or (oracle is not None and not holders.get("oracle")):
            continue
        reason = _layout_dependence(kind, holders)
        if reason:
            not_comparable.append(NotComparable(kind, None, reason))
            continue
        varying = _shapes_vary(kind, holders)
        for name, why in varying.items():
            not_comparable.append(NotComparable(kind, name, why))
        for crc in holders["cand"]:
            rrc = _representative(kind, crc, holders["ref"])
            orc = _representative(kind, crc, holders["oracle"]) if oracle is not None else None
            if rrc is None or (oracle is not None and orc is None):
                side = "ref" if rrc is None else "oracle"
                problems.add("missing_rank", side, crc.rank, detail=f" holding data-parallel shard {crc.dp[1]} of {kind}")
                continue
            kp = _make_pair(kind, rrc, crc, orc, problems)
            if kp is not None:
                kp.tensors = [t for t in kp.tensors if t.name not in varying]
                pairs.append(kp)
    return pairs, not_comparable


def _layout_dependence(kind, holders) -> str | None:
    if kind not in LAYOUT_DEPENDENT_KINDS:
        return None
    degrees = {role: sorted({rc.dp[0] for rc in rcs}) for role, rcs in holders.items()}
    if len(degrees["ref"]) == 1 and degrees["ref"] == degrees["cand"] and degrees.get("oracle", degrees["ref"]) == degrees["ref"]:
        return None
    return (f"per-rank {kind} depend on the data-parallel layout "
            f"(dp degree {','.join(map(str, degrees['ref']))} in ref, {','.join(map(str, degrees['cand']))} in cand)")


def _shapes_vary(kind, holders) -> dict[str, str]:
    """Tensors of an unknown kind whose shape differs between ranks or runs: sharded, so not comparable."""
    if kind in REPLICATED_KINDS or kind in LAYOUT_DEPENDENT_KINDS:
        return {}
    shapes: dict[str, set] = {}
    for rcs in holders.values():
        for rc in rcs:
            for name, t in rc.kinds[kind].tensors.items():
                shapes.setdefault(name, set()).add(t.shape)
    return {n: f"shape differs between ranks or runs ({', '.join(map(str, sorted(s)))}): depends on the layout"
            for n, s in shapes.items() if len(s) > 1}


def _representative(kind, crc, candidates):
    if kind in LAYOUT_DEPENDENT_KINDS:
        candidates = [rc for rc in candidates if rc.dp[1] == crc.dp[1]]
    return min(candidates, key=lambda rc: rc.rank) if candidates else None
