"""What the report's pictures show, computed from the open_diff Dataset (no drawing here).

Pictures show violation *margin*, not raw relative error: the diff's `margin` of each comparison,
the error over the bound of the rule closer to failing (elementwise: max |cand - ref| / (atol +
rtol |ref|); norm: ||cand - ref|| over its bound), so a comparison fails exactly when its margin
exceeds 1, and a passing near-zero element (huge relative error, tiny absolute error) stays below
1 instead of outshining the failure. A NaN/Inf mismatch has an infinite margin ("non-finite").
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# cell states of a heatmap, over (rank, step)
NOT_COMPARED, PASS, FAIL, NONFINITE = 0, 1, 2, 3


def margins(ds) -> np.ndarray:
    """(rank, step, tensor) margin of every comparison; NaN where nothing was compared."""
    m = ds["margin"].values.astype(float)
    nonfinite = np.nan_to_num(ds["nonfinite"].values.astype(float))
    m = np.where(nonfinite > 0, np.inf, m)
    return np.where(ds["compared"].values, m, np.nan)


def _failed(ds) -> np.ndarray:
    return ds["compared"].values & ~ds["passed"].values


@dataclass
class Heatmap:
    """One kind's cells over (rank, step): the largest margin over its tensors and the cell state."""

    kind: str
    ranks: np.ndarray
    steps: np.ndarray
    margin: np.ndarray  # float (rank, step); NaN: not compared, inf: non-finite
    state: np.ndarray  # int (rank, step): NOT_COMPARED, PASS, FAIL, NONFINITE


def heatmaps(ds) -> list[Heatmap]:
    """One Heatmap per kind, in compute order; steps where the kind was never compared are left out."""
    from tracekit.store.kinds import kind_order

    m = margins(ds)
    kinds_of = np.asarray([str(k) for k in ds["kind"].values])
    failed = _failed(ds)
    nonfinite = np.nan_to_num(ds["nonfinite"].values.astype(float))
    compared = ds["compared"].values
    out = []
    for kind in sorted(set(kinds_of), key=lambda k: (kind_order(k), k)):
        sel = kinds_of == kind
        any_compared = compared[:, :, sel].any(axis=2)
        with np.errstate(invalid="ignore"):
            worst = np.where(any_compared, np.nanmax(np.where(compared[:, :, sel], m[:, :, sel], -np.inf), axis=2), np.nan)
        state = np.full(worst.shape, NOT_COMPARED, dtype=np.int8)
        state[any_compared] = PASS
        state[failed[:, :, sel].any(axis=2)] = FAIL
        state[(nonfinite[:, :, sel] > 0).any(axis=2)] = NONFINITE
        keep = any_compared.any(axis=0)  # e.g. parameters alone have step 0
        out.append(Heatmap(kind, ds["rank"].values, ds["step"].values[keep], worst[:, keep], state[:, keep]))
    return out


@dataclass
class WorstTensor:
    tensor: str
    margin: float  # the largest over (rank, step); inf: non-finite
    rank: int
    step: int
    max_rel_err: float  # at that (rank, step)
    violations: int  # violating elements over all ranks and steps
    failing_pairs: int  # (rank, step) pairs that failed (either rule)
    rtol: float


def worst_tensors(ds, n: int = 15) -> list[WorstTensor]:
    """The n tensors with the largest margin (any failing tensor before every passing one)."""
    m = margins(ds)
    failed = _failed(ds)
    violations = np.nan_to_num(ds["violations"].values.astype(float))
    rel = ds["max_rel_err"].values.astype(float)
    out = []
    for k, key in enumerate(ds["tensor"].values):
        mk = m[:, :, k]
        if np.isnan(mk).all():
            continue  # never compared
        i, j = np.unravel_index(int(np.argmax(np.nan_to_num(mk, nan=-1.0, posinf=np.inf))), mk.shape)
        out.append(WorstTensor(str(key), float(mk[i, j]), int(ds["rank"].values[i]), int(ds["step"].values[j]),
                               float(rel[i, j, k]), int(violations[:, :, k].sum()), int(failed[:, :, k].sum()),
                               float(ds["rtol"].values[k])))
    out.sort(key=lambda w: (w.failing_pairs > 0, w.margin), reverse=True)
    return out[:n]
