"""What the report's pictures show, computed from the open_diff Dataset (no drawing here).

Pictures show violation *margin*, not raw relative error: the error of a comparison's worst
element divided by the bound it had to meet,

    margin = |cand - ref| / (atol + rtol * |ref|)   at the worst element the diff picked,

so a comparison fails exactly when its margin exceeds 1, and a passing near-zero element (huge
relative error, tiny absolute error) stays below 1 instead of outshining the failure. A
comparison whose violations include NaN/Inf mismatches has an infinite margin ("non-finite").
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# cell states of a heatmap, over (rank, step)
NOT_COMPARED, PASS, FAIL, NONFINITE = 0, 1, 2, 3


def margins(ds) -> np.ndarray:
    """(rank, step, tensor) margin of every comparison; NaN where nothing was compared."""
    err = ds["worst_abs_err"].values.astype(float)
    ref = np.abs(ds["worst_ref"].values.astype(float))
    rtol = ds["rtol"].values.astype(float)[None, None, :]
    atol = ds["atol"].values.astype(float)[None, None, :]
    bound = atol + rtol * ref
    with np.errstate(divide="ignore", invalid="ignore"):
        m = np.where(bound > 0, err / bound, np.where(err > 0, np.inf, 0.0))
    violations = np.nan_to_num(ds["violations"].values.astype(float))
    nonfinite = np.nan_to_num(ds["nonfinite"].values.astype(float))
    m = np.where(nonfinite > 0, np.inf, m)
    # a violation is a margin above 1 by definition: keep it so where rounding of the bound disagrees
    m = np.where((violations > 0) & ~(m > 1), np.nextafter(1.0, 2.0), m)
    m = np.where((violations == 0) & (m > 1), 1.0, m)
    return np.where(ds["compared"].values, m, np.nan)


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
    from tracekit.store.format import kind_order

    m = margins(ds)
    kinds_of = np.asarray([str(k) for k in ds["kind"].values])
    violations = np.nan_to_num(ds["violations"].values.astype(float))
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
        state[(violations[:, :, sel] > 0).any(axis=2)] = FAIL
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
    failing_pairs: int  # (rank, step) pairs with a violation
    rtol: float


def worst_tensors(ds, n: int = 15) -> list[WorstTensor]:
    """The n tensors with the largest margin (any failing tensor before every passing one)."""
    m = margins(ds)
    violations = np.nan_to_num(ds["violations"].values.astype(float))
    rel = ds["max_rel_err"].values.astype(float)
    out = []
    for k, key in enumerate(ds["tensor"].values):
        mk = m[:, :, k]
        if np.isnan(mk).all():
            continue  # never compared
        i, j = np.unravel_index(int(np.argmax(np.nan_to_num(mk, nan=-1.0, posinf=np.inf))), mk.shape)
        v = violations[:, :, k]
        out.append(WorstTensor(str(key), float(mk[i, j]), int(ds["rank"].values[i]), int(ds["step"].values[j]),
                               float(rel[i, j, k]), int(v.sum()), int((v > 0).sum()), float(ds["rtol"].values[k])))
    out.sort(key=lambda w: (w.violations > 0, w.margin), reverse=True)
    return out[:n]
