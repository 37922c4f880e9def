"""Error patterns that need no fit, read off a step's per-tensor results (compare/structure.py
turns them into signatures like the fits'):

- one rank only: the candidate differs from the reference on one rank, every other rank holds
  exactly the reference's values. For a replicated kind (gradients, deltas: every data-parallel
  rank holds the same full tensor) that is a violation even inside the bounds: the candidate's
  replicas disagree with each other, which no rounding does. For the other kinds it only names
  the failing tensors' pattern.
- NaN/Inf: where the candidate holds non-finite values the reference does not (which ranks,
  which tensors, whether every element, and where in a small tensor: compare/rows.py). Those are
  violations already; the pattern names them.
- permuted rows, transposed: a failing tensor whose candidate holds the reference's rows in another
  order, or a square one its transpose (compare/rows.py: only failing small tensors are read again).
"""

from __future__ import annotations

from tracekit.compare.structure import Signature
from tracekit.display import shown
from tracekit.store.kinds import REPLICATED_KINDS


def one_rank_signature(step: int, kind: str, results) -> Signature | None:
    """The candidate differs on exactly one of at least two ranks, the others equal the reference
    bit for bit; None where that is not so or cannot be told (a tensor compared by summaries)."""
    ranks: dict[int, bool] = {}  # rank -> differs
    for r in results:
        if r.metrics.fit is None and r.metrics.compared:
            return None  # compared without the sums (summaries): equality unknown
        d = (r.metrics.fit is not None and r.metrics.fit[2] > 0) or r.metrics.nonfinite > 0
        ranks[r.rank] = ranks.get(r.rank, False) or d
    differing = [rank for rank, d in ranks.items() if d]
    if len(ranks) < 2 or len(differing) != 1:
        return None
    rank = differing[0]
    failing = [r for r in results if r.rank == rank and not r.passed]
    if kind not in REPLICATED_KINDS and not failing:
        return None  # per-rank values may legitimately differ on one rank: a name for failures only
    mine = [r for r in results if r.rank == rank and ((r.metrics.fit or (0, 0, 0))[2] > 0 or r.metrics.nonfinite)]
    example = max(mine, key=lambda r: (r.metrics.nonfinite, (r.metrics.fit or (0, 0, 0))[2]))
    n, others = len({r.tensor for r in mine}), len(ranks) - 1
    why = ": the candidate's replicas disagree" if kind in REPLICATED_KINDS else ""
    return Signature(step, kind, "one rank", None, None, None, [rank], False, n, example=example,
                     detail=(f"one rank: {kind} differ on rank {rank} only ({n} tensor{'s' if n != 1 else ''}), "
                             f"the other {others} rank{'s' if others != 1 else ''} equal{'s' if others == 1 else ''} "
                             f"the reference exactly{why}"))


def nonfinite_signature(step: int, kind: str, results) -> Signature | None:
    """Where the candidate has NaN/Inf that the reference has not: ranks, tensors, all elements or some."""
    hit = [r for r in results if r.metrics.nonfinite and r.metrics.counts.cand_nan + r.metrics.counts.cand_inf
           > r.metrics.counts.ref_nan + r.metrics.counts.ref_inf]
    if not hit:
        return None
    ranks = sorted({r.rank for r in hit})
    tensors = list(dict.fromkeys(r.tensor for r in hit))
    every = all(r.metrics.counts.cand_nan + r.metrics.counts.cand_inf == r.metrics.numel for r in hit)
    count = sum(r.metrics.counts.cand_nan + r.metrics.counts.cand_inf for r in hit)
    all_ranks = set(ranks) == {r.rank for r in results}
    sig = Signature(step, kind, "nonfinite", None, None, None, ranks, all_ranks, len(tensors),
                    example=max(hit, key=lambda r: r.metrics.nonfinite), tensor=tensors[0])
    what = "every element" if every else f"{count} element{'s' if count != 1 else ''}"
    where = sig.where.replace("all tensors and ranks", "all ranks")
    sig.detail = f"non-finite: {kind} NaN/Inf in the candidate, {what} of {where}"
    placed = next((r for r in hit if (r.layout or {}).get("how") == "nonfinite"), None)
    if placed is not None and not every:
        sig.detail += f" (rank {placed.rank} {shown(placed.tensor)}: {placed.layout['where']})"
    return sig


def row_signatures(step: int, kind: str, results) -> list[Signature]:
    """Failing tensors whose candidate rows are the reference's in another order ('permuted rows')
    or a square one's transpose ('transposed'), one signature per shape."""
    out = []
    all_ranks = {r.rank for r in results}
    for shape in ("permuted rows", "transposed"):
        hit = [r for r in results if not r.passed and (r.layout or {}).get("how") == shape]
        if not hit:
            continue
        ranks = sorted({r.rank for r in hit})
        tensors = list(dict.fromkeys(r.tensor for r in hit))
        first = hit[0]
        sig = Signature(step, kind, shape, None, None, None, ranks, set(ranks) == all_ranks, len(tensors),
                        example=first, tensor=tensors[0], names=[(r.rank, r.tensor) for r in hit])
        if shape == "permuted rows":
            i, j = first.layout["example"]
            sig.detail = (f"permuted rows: {kind} rows match the reference's in another order on {sig.where} "
                          f"(e.g. rank {first.rank} {shown(first.tensor)}: row {i} = ref row {j}; "
                          f"{first.layout['moved']} rows moved)")
        else:
            sig.detail = f"transposed: {kind} equal the reference's transpose on {sig.where}"
        out.append(sig)
    return out
