"""How many terms the reductions behind a recorded tensor summed, from what the stores know.

The norm rule's default bound (tolerances.py, docs/DIFF.md "The norm rule") has a term for
reordered reductions, sqrt(n) * kappa * u_acc, which assumed n = 4096 terms. Here n is derived
per tensor from the recorded shapes and layout:

  gradients, loss    every token of the global batch: a weight gradient sums x^T dy over the
                     local tokens, then the data-parallel reduction over the dp ranks; the loss
                     is their mean. n = local tokens x dp degree.
  local_loss         the local tokens.
  outputs            the hidden size: each activation is a dot product over a layer's input
                     features. n = the largest last dimension of a recorded 2-D (or wider)
                     parameter or gradient (Linear's in_features, an embedding's width).
  everything else    nothing of its own (parameters and deltas are p - lr * g elementwise; the
                     gradient carries the reduction): no n, the assumed 4096 stays.

Local tokens are the rows of the rank's largest output (its elements over its last dimension:
batch x sequence for a (batch, seq, vocab) logit tensor, the batch for (batch, features)); the dp
degree is the ranks' recorded `dp_degree`. Each side is derived on its own and the larger n of
the two applies, as the lower precision of the two does (a reduction that is longer on one side
can round more there). Where the stores do not say (no outputs recorded, no 2-D parameter), the
tensor has no n and the bound keeps the 4096 it always assumed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# Kinds whose reductions run over every token of the global batch, and over the local ones.
_GLOBAL_TOKENS = {"gradients", "loss"}
_LOCAL_TOKENS = {"local_loss"}
_HIDDEN = {"outputs"}
_WEIGHT_KINDS = ("parameters", "gradients")


@dataclass(frozen=True)
class Reduction:
    """n terms, and how they were counted (for the report)."""

    n: int
    why: str


@dataclass(frozen=True)
class _Layout:
    tokens: int | None  # rows of the largest output, over the ranks
    dp: int  # data-parallel degree
    hidden: int | None  # largest last dimension of a 2-D+ parameter or gradient


def _layout(catalog) -> _Layout:
    tokens, hidden, dp = None, None, 1
    for rc in catalog.ranks.values():
        d = rc.dp[0]
        if d > dp:
            dp = d
        out = rc.kinds.get("outputs")
        if out is not None and out.tensors:
            t = max(out.tensors.values(), key=lambda i: math.prod(i.shape))
            rows = math.prod(t.shape[:-1]) if len(t.shape) >= 2 else (t.shape[0] if t.shape else 1)
            tokens = max(tokens or 0, int(rows)) or None
        for kind in _WEIGHT_KINDS:
            k = rc.kinds.get(kind)
            for info in (k.tensors.values() if k is not None else ()):
                if len(info.shape) >= 2:
                    hidden = max(hidden or 0, int(info.shape[-1])) or None
    return _Layout(tokens, dp, hidden)


def _of(layout: _Layout, kind: str) -> Reduction | None:
    if kind in _GLOBAL_TOKENS and layout.tokens:
        return Reduction(layout.tokens * layout.dp, f"{layout.tokens} local tokens x dp degree {layout.dp}")
    if kind in _LOCAL_TOKENS and layout.tokens:
        return Reduction(layout.tokens, f"{layout.tokens} local tokens")
    if kind in _HIDDEN and layout.hidden:
        return Reduction(layout.hidden, f"hidden size {layout.hidden}")
    return None


class ReductionLengths:
    """The n of each (kind, tensor) of a comparison: the larger of the two sides'."""

    def __init__(self, *catalogs):
        self._layouts = [_layout(c) for c in catalogs]
        self._cache: dict[str, Reduction | None] = {}

    def of(self, kind: str, tensor: str = "") -> Reduction | None:
        # every tensor of a kind sums over the same tokens or hidden size in this derivation
        if kind not in self._cache:
            found = [r for r in (_of(lay, kind) for lay in self._layouts) if r is not None]
            self._cache[kind] = max(found, key=lambda r: r.n) if found else None
        return self._cache[kind]
