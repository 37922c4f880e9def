"""Matches with the wrong reference value: exact ones from the stores' content hashes (format 2;
index reads only, no tensor is read again), near ones (compare/near.py) where there is none:

- stale: a candidate tensor that differs from the reference at its step equals the reference's
  same tensor at a neighbouring step bit for bit (an update skipped, a value not refreshed);
- swapped: a candidate rank's tensor (or a shard of it) equals another rank's reference value
  bit for bit while the two ranks' reference values differ (shards or data swapped between ranks).

A content hash match between different values has negligible odds, so a match is a violation
even inside the bounds. A candidate computed with other arithmetic (an accelerator) never matches
bitwise: a failing tensor of it is then held against the same reference values within its own
bound and the nearness rule of compare/near.py, and a near match is reported the same way, with
how close it is. A match of an all-zero reference value (its summary's L2 norm is 0) is not taken:
it says nothing of where the value came from.
"""

from __future__ import annotations

from collections import Counter

from tracekit.compare.structure import Signature
from tracekit.errors import StoreError
from tracekit.store.summaries import L2

# The reference steps a stale value is looked for at, relative to its step, in this order.
STALE_OFFSETS = (-1, 1, -2)
MIN_ELEMENTS = 2  # a scalar can equal another step's by chance (a loss that stopped moving)


class _Digests:
    """Each side's digests and summaries of a (rank, kind, step), read once per step's pass."""

    def __init__(self, catalog):
        self.catalog = catalog
        self.cache: dict[tuple, object] = {}

    def get(self, what: str, rank: int, kind: str, step: int):
        key = (what, rank, kind, step)
        if key not in self.cache:
            rc = self.catalog.ranks.get(rank)
            value = None
            if rc is not None and kind in rc.kinds and rc.kinds[kind].has_step(step):
                try:
                    value = rc.view.digests(kind, step) if what == "digests" else rc.view.summaries(kind, step)
                except StoreError:
                    value = None  # that step's own comparison reports the damage
            self.cache[key] = value
        return self.cache[key]

    def nonzero(self, rank: int, kind: str, step: int, name: str) -> bool:
        s = self.get("summaries", rank, kind, step)
        return s is None or float(s[name][L2]) != 0.0


def match_signatures(step: int, kind: str, pairs, ref_catalog, cand_catalog, results, near=None) -> list[Signature]:
    """The stale and swapped signatures of one kind at one step (pairs: its KindPairs; near: a
    compare/near.py NearMatcher for this step and kind, or None for exact matches only)."""
    differs = {(r.rank, r.tensor) for r in results if not r.passed or r.metrics.fit is None or r.metrics.fit[2] > 0}
    if not differs:
        return []
    ref, cand = _Digests(ref_catalog), _Digests(cand_catalog)
    by_key = {(r.rank, r.tensor): r for r in results}
    all_ranks = {r.rank for r in results}
    ref_ranks = sorted({kp.ref_rank for kp in pairs})
    stale: list[tuple[int, str, int]] = []  # (cand rank, tensor, the reference's step)
    swapped: dict[tuple[int, int], set] = {}  # (cand rank, ref rank) -> tensors
    # the near matches' closeness (compare/near.py) of each shape: empty when all are exact
    stale_near: list = []
    swapped_near: list = []
    unsharded = {(kp.ref_rank, t.name): t.ref for kp in pairs for t in kp.tensors if t.ref.shard is None}
    for kp in pairs:
        cd = cand.get("digests", kp.rank, kind, step)
        own = ref.get("digests", kp.ref_rank, kind, step)
        if cd is None or own is None:
            continue
        for t in kp.tensors:
            if (kp.rank, t.name) not in differs or t.ref.numel < MIN_ELEMENTS:
                continue
            c = cd.get(t.cand.name)
            if c is None or c == own.get(t.ref.name):
                continue
            found = False
            for off in STALE_OFFSETS:
                other = ref.get("digests", kp.ref_rank, kind, step + off)
                if other is not None and other.get(t.ref.name) == c and ref.nonzero(kp.ref_rank, kind, step + off, t.ref.name):
                    stale.append((kp.rank, t.name, step + off))
                    found = True
                    break
            if t.cand.shard is None and t.ref.shard is None:
                for q in ref_ranks:
                    theirs = ref.get("digests", q, kind, step)
                    if (q != kp.ref_rank and theirs is not None and theirs.get(t.ref.name) == c
                            and ref.nonzero(q, kind, step, t.ref.name)):
                        swapped.setdefault((kp.rank, q), set()).add(t.name)
                        found = True
            else:
                for pair in _swapped_pieces(kind, step, kp, t, ref_catalog, cand_catalog):
                    swapped.setdefault(pair, set()).add(t.name)
                    found = True
            result = by_key.get((kp.rank, t.name))
            if found or near is None or result is None or not near.wanted(t, result):
                continue
            hit = near.stale(kp, t, result, STALE_OFFSETS)
            if hit is not None:
                stale.append((kp.rank, t.name, hit[0]))
                stale_near.append(hit[1])
            if t.cand.shard is None and t.ref.shard is None:
                others = {q: unsharded[(q, t.name)] for q in ref_ranks if (q, t.name) in unsharded}
                for q, how in near.swapped(kp, t, result, others):
                    swapped.setdefault((kp.rank, q), set()).add(t.name)
                    swapped_near.append(how)
    out = []
    if stale:
        ranks = sorted({r for r, _, _ in stale})
        names = list(dict.fromkeys(n for _, n, _ in stale))
        source = Counter(s for _, _, s in stale).most_common(1)[0][0]
        out.append(Signature(step, kind, "stale", None, None, None, ranks, set(ranks) == all_ranks, len(names),
                             example=by_key.get((stale[0][0], stale[0][1])), tensor=names[0], source_step=source,
                             names=[(r, n) for r, n, _ in stale], near=_closeness(stale_near)))
    if swapped:
        ranks = sorted({c for c, _ in swapped})
        names = list(dict.fromkeys(n for ns in swapped.values() for n in sorted(ns)))
        first = min(swapped)
        example = by_key.get((first[0], sorted(swapped[first])[0])) or next(
            (r for r in results if r.tensor == names[0]), None)
        out.append(Signature(step, kind, "swapped", None, None, None, ranks, set(ranks) == all_ranks, len(names),
                             example=example, tensor=names[0], source_ranks=[list(p) for p in sorted(swapped)],
                             names=[(c, n) for (c, _), ns in swapped.items() for n in ns],
                             near=_closeness(swapped_near)))
    return out


def _closeness(nearness: list) -> dict | None:
    """How close the loosest near match is (None: every match is exact)."""
    if not nearness:
        return None
    closer = min(n.closer for n in nearness)
    return {"rel_l2_err": max(n.rel_l2_err for n in nearness), "closer": None if closer == float("inf") else closer}


def _swapped_pieces(kind: str, step: int, kp, t, ref_catalog, cand_catalog) -> set[tuple[int, int]]:
    """(candidate rank, reference rank) of each candidate shard that holds another region's
    reference shard bit for bit (sharded tensors: the pieces' own hashes)."""
    if t.cand.shard is None or t.ref.shard is None:
        return set()
    try:
        cps = cand_catalog.ranks[kp.rank].view.pieces(kind, step, t.cand.name)
        rps = ref_catalog.ranks[kp.ref_rank].view.pieces(kind, step, t.ref.name)
    except StoreError:
        return set()
    ref_at = {p.region: p for p in rps}
    ref_by_digest = {p.digest: p for p in rps}
    out = set()
    for p in cps:
        mine, theirs = ref_at.get(p.region), ref_by_digest.get(p.digest)
        if mine is not None and theirs is not None and mine.digest != p.digest and theirs.region != p.region:
            out.add((p.view.rank, theirs.view.rank))
    return out
