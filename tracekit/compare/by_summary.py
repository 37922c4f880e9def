"""Comparing two tensors by their summaries, where a side kept no bytes (format 2, `--full`).

Each statistic of the candidate must be within the kind's tolerance of the reference's, with
bounds chosen so that every pair that passes elementwise also passes here (the check is a
necessary condition of the elementwise one, never stricter):

    min, max, mean:  |c - r| <= atol + rtol * A          A = max(|min_ref|, |max_ref|)
    L2 norm:         |c - r| <= atol * sqrt(n) + rtol * L2_ref      n = finite elements

(if |cand_i - ref_i| <= atol + rtol |ref_i| for every i, each statistic moves by at most these
bounds). NaN, Inf and -Inf counts must be equal (-Inf unknown in stores older than it); a NaN on either side is a violation unless equal_nan,
as it is elementwise. The converse does not hold: summaries cannot see errors that leave every
statistic in bounds (a permutation, offsetting errors), so the report says which tensors were
compared this way. The norm rule (rel_l2) and the oracle need elements and do not apply here.
`violations` counts the statistics outside tolerance (not elements).
"""

from __future__ import annotations

import math

import numpy as np

from tracekit.compare.metrics import NonFinite, TensorMetrics, WorstElement
from tracekit.store.summaries import INF, L2, MAX, MEAN, MIN, NAN, NEG_INF, scalar_value


def compare_summaries(ref: np.ndarray, cand: np.ndarray, shape: tuple[int, ...], rtol: float, atol: float,
                      equal_nan: bool = False) -> TensorMetrics:
    """Metrics of a tensor pair known only by their summaries (store/summaries.py SUMMARY_FIELDS).
    A one-element tensor (the loss) is known exactly: its summary's mean is its value."""
    numel = math.prod(shape)
    counts = NonFinite(int(ref[NAN]), int(ref[INF]), int(cand[NAN]), int(cand[INF]))
    nonfinite = int(counts.ref_nan != counts.cand_nan) + int(counts.ref_inf != counts.cand_inf)
    ref_neg, cand_neg = float(ref[NEG_INF]), float(cand[NEG_INF])
    if counts.ref_inf == counts.cand_inf and not (math.isnan(ref_neg) or math.isnan(cand_neg)):
        nonfinite += int(ref_neg != cand_neg)  # as many Infs, other signs (NaN: an older store, unknown)
    if not equal_nan and (counts.ref_nan or counts.cand_nan) and counts.ref_nan == counts.cand_nan:
        nonfinite += 1  # NaN never equals NaN elementwise: so here neither
    n_fin = max(0, numel - counts.ref_nan - counts.ref_inf)
    violations, margin, max_abs, max_rel = nonfinite, 0.0, 0.0, 0.0
    if n_fin and not any(math.isnan(float(ref[i])) or math.isnan(float(cand[i])) for i in (MIN, MAX, MEAN)):
        scale = max(abs(float(ref[MIN])), abs(float(ref[MAX])))
        bounds = {MIN: atol + rtol * scale, MAX: atol + rtol * scale, MEAN: atol + rtol * scale,
                  L2: atol * math.sqrt(n_fin) + rtol * float(ref[L2])}
        for i, bound in bounds.items():
            err = abs(float(cand[i]) - float(ref[i]))
            max_abs = max(max_abs, err)
            if ref[i]:
                max_rel = max(max_rel, err / abs(float(ref[i])))
            elif err:
                max_rel = math.inf
            m = err / bound if bound > 0 else (0.0 if err == 0 else math.inf)
            margin = max(margin, m)
            violations += int(m > 1.0)
        rel_l2 = abs(float(cand[L2]) - float(ref[L2])) / float(ref[L2]) if ref[L2] else (0.0 if cand[L2] == 0 else math.inf)
        worst = None
        if numel == 1:
            worst = WorstElement((0,) * len(shape), float(ref[MEAN]), float(cand[MEAN]), abs(float(cand[MEAN]) - float(ref[MEAN])))
        return TensorMetrics(numel, rtol, atol, violations, nonfinite, max_abs, max_rel, rel_l2, None, worst,
                             elem_margin=margin, compared=n_fin, counts=counts)
    # nothing finite to compare (or one side has no finite element): only the counts decide
    if bool(n_fin) != (numel - counts.cand_nan - counts.cand_inf > 0):
        violations += 1
    worst = None
    if numel == 1:  # a non-finite loss: its value is still known (scalar_value), and shown
        r, c = scalar_value(ref), scalar_value(cand)
        worst = WorstElement((0,) * len(shape), r, c, abs(c - r))
    return TensorMetrics(numel, rtol, atol, violations, nonfinite, None, None, None, None, worst,
                         compared=0, counts=counts)
