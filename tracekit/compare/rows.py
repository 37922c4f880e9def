"""Where in a failing tensor its error lies, read off both sides' values (compare/patterns.py turns
it into signatures). Only tensors that fail their bound pay for it, and only small ones
(ROWS_MAX rows, NUMEL_MAX elements): the values are read once more, after the verdict.

- permuted rows: the candidate's rows are the reference's rows in another order (a row-rolled
  output, rows gathered with a wrong index). Rows are paired by their L2 norms (sorted), and every
  paired row must then agree elementwise within the tensor's own rtol/atol: rows that merely have
  similar norms (noise, other values) never pair all the way, and rows of tied norms that pair
  wrongly fail that check: then nothing is said.
- transposed: a square matrix whose candidate equals the reference's transpose within rtol/atol.
- where the NaN/Inf are: the candidate's non-finite values that the reference has not, as one
  element, whole rows, whole columns or every element (in the tensor's first dimension against the
  rest flattened).
"""

from __future__ import annotations

import numpy as np

ROWS_MAX = 4096
NUMEL_MAX = 1 << 22


def wanted(shape: tuple, passed: bool, nonfinite: int) -> bool:
    """Whether a tensor's values are worth reading again for its layout: it failed, is a matrix
    (or more) of at least two rows, and is small."""
    n = int(np.prod(shape)) if shape else 0
    return (not passed and len(shape) >= 2 and 2 <= shape[0] <= ROWS_MAX and n <= NUMEL_MAX
            and (nonfinite > 0 or n > shape[0]))


def layout(ref, cand, rtol: float, atol: float) -> dict | None:
    """{"how": "permuted rows", "example": (cand row, ref row), "moved": n} or {"how": "transposed"}
    or {"how": "nonfinite", "where": text}; None when the error has none of these shapes."""
    ref, cand = np.asarray(ref), np.asarray(cand)
    if ref.shape != cand.shape or ref.ndim < 2 or ref.shape[0] < 2:
        return None
    a = ref.reshape(ref.shape[0], -1).astype(np.float64)
    b = cand.reshape(cand.shape[0], -1).astype(np.float64)
    bad = ~np.isfinite(b) & np.isfinite(a)
    if bad.any():
        return {"how": "nonfinite", "where": _nonfinite_where(bad)}
    if not (np.isfinite(a).all() and np.isfinite(b).all()):
        return None
    if _close(a, b, rtol, atol):
        return None  # the rows in place agree: nothing moved
    if ref.ndim == 2 and a.shape[0] == a.shape[1] and _close(a.T, b, rtol, atol):
        return {"how": "transposed"}
    na, nb = np.linalg.norm(a, axis=1), np.linalg.norm(b, axis=1)
    oa, ob = np.argsort(na, kind="stable"), np.argsort(nb, kind="stable")
    source = np.empty(len(ob), dtype=np.int64)
    source[ob] = oa  # cand row i holds ref row source[i]
    if not _close(a[source], b, rtol, atol):
        return None
    moved = np.flatnonzero(source != np.arange(len(source)))
    i = int(moved[0])
    return {"how": "permuted rows", "example": (i, int(source[i])), "moved": int(moved.size)}


def _close(a, b, rtol: float, atol: float) -> bool:
    return bool(np.all(np.abs(b - a) <= atol + rtol * np.abs(a)))


def _nonfinite_where(bad: np.ndarray) -> str:
    count = int(bad.sum())
    if count == bad.size:
        return "every element"
    if count == 1:
        i, j = np.argwhere(bad)[0]
        return f"one element (row {int(i)}, column {int(j)})"
    rows, cols = np.flatnonzero(bad.all(axis=1)), np.flatnonzero(bad.all(axis=0))
    if rows.size and count == rows.size * bad.shape[1]:
        return _listed("row", rows)
    if cols.size and count == cols.size * bad.shape[0]:
        return _listed("column", cols)
    return f"{count} scattered elements"


def _listed(what: str, idx) -> str:
    shown = ", ".join(str(int(i)) for i in idx[:3]) + (", ..." if idx.size > 3 else "")
    return f"whole {what}{'s' if idx.size > 1 else ''} {shown}"
