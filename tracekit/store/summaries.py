"""Per-tensor summaries (format v2): min, max, mean, L2 norm, NaN count, Inf count, -Inf count.

Every recorded tensor (or shard) gets one, whether or not its bytes are kept (`--full`): the
writer computes it from the bytes it hashes (the rank's writer process, on the CPU, from the
spooled bytes), and stores it beside the hash in the kind's `summary` index array, one float64
row of SUMMARY_FIELDS per tensor. min, max, mean and L2 are over the finite elements (NaN when
there is none, L2 then 0); `inf` counts every infinite element, `neg_inf` those of them that are
-Inf (so a loss of -Inf and one of +Inf differ without their bytes); complex tensors are
summarized by their magnitudes, integer and bool tensors as float64 (exact below 2**53).
"""

from __future__ import annotations

import math

import numpy as np
import xxhash

from tracekit.store.dtypes import to_numpy_values
from tracekit.store.scratch import thread_buffer

SUMMARY_FIELDS = ("min", "max", "mean", "l2", "nan", "inf", "neg_inf")
N_FIELDS = len(SUMMARY_FIELDS)
MIN, MAX, MEAN, L2, NAN, INF, NEG_INF = range(N_FIELDS)
# Stores written before `neg_inf` existed hold the first six fields only; read back, their
# `neg_inf` is NaN (unknown): -Inf and +Inf elements are told apart only where both sides know.
LEGACY_FIELDS = 6
# A summary row ends in SEAL_SLOTS float64 slots holding the xxh3-128 of the values before them:
# a summary is read only where bytes are missing, so damage to it must show without the bytes.
SEAL_SLOTS = 2


def row_width(tensors: int, fields: int = N_FIELDS) -> int:
    """float64 values in one summary row of a kind with this many tensors."""
    return fields * tensors + SEAL_SLOTS


def fields_of(width: int, tensors: int) -> int | None:
    """Fields per tensor of a summary array this wide (N_FIELDS, or LEGACY_FIELDS in older stores);
    None when the width fits neither (a damaged index)."""
    for fields in (N_FIELDS, LEGACY_FIELDS):
        if width == row_width(tensors, fields):
            return fields
    return None


def seal(values: np.ndarray) -> np.ndarray:
    """A summary row: the flat float64 values, then their checksum."""
    values = np.ascontiguousarray(values, dtype=np.float64).reshape(-1)
    digest = np.frombuffer(xxhash.xxh3_128_digest(values.tobytes()), dtype=np.float64)
    return np.concatenate([values, digest])


def unseal(row: np.ndarray, fields: int = N_FIELDS) -> np.ndarray | None:
    """The values of a summary row of `fields` per tensor, shaped (tensors, N_FIELDS) (a legacy
    row's neg_inf NaN: unknown); None when its checksum does not match."""
    values, digest = row[:-SEAL_SLOTS], row[-SEAL_SLOTS:]
    if xxhash.xxh3_128_digest(np.ascontiguousarray(values).tobytes()) != np.ascontiguousarray(digest).tobytes():
        return None
    values = values.reshape(-1, fields)
    if fields < N_FIELDS:
        values = np.concatenate([values, np.full((values.shape[0], N_FIELDS - fields), math.nan)], axis=1)
    return values


# Elements summarized at a time: the float64 copy of a block stays in the CPU's cache, so the
# passes over it after the first cost little, and the temporaries stay bounded whatever the size.
_BLOCK = 1 << 16


def summarize(data: np.ndarray, dtype: str) -> np.ndarray:
    """The summary (float64[N_FIELDS]) of a flat tensor or shard `data` in storage dtype.

    Per block: min and max in the values' own dtype (exact, and a NaN or Inf makes one of them
    non-finite, so they double as the check for those), then sum and sum of squares of the
    block's float64 copy."""
    flat = np.ascontiguousarray(data).reshape(-1)
    lo, hi, total, ss, nans, infs, neg_infs, n_fin = math.inf, -math.inf, 0.0, 0.0, 0, 0, 0, 0
    for start in range(0, flat.size, _BLOCK):
        vals = to_numpy_values(flat[start : start + _BLOCK], dtype)
        if vals.dtype.kind == "c":
            vals = np.where(np.isnan(vals), np.nan, np.abs(vals))  # a NaN part stays a NaN
        if vals.dtype.kind == "f":
            with np.errstate(invalid="ignore"):
                b_lo, b_hi = float(np.minimum.reduce(vals)), float(np.maximum.reduce(vals))
            if not (math.isfinite(b_lo) and math.isfinite(b_hi)):  # a NaN or an Inf: look closer
                nan_mask, inf_mask = np.isnan(vals), np.isinf(vals)
                nans += int(np.count_nonzero(nan_mask))
                infs += int(np.count_nonzero(inf_mask))
                neg_infs += int(np.count_nonzero(inf_mask & (vals < 0)))
                vals = vals[~(nan_mask | inf_mask)]
                if not vals.size:
                    continue
                b_lo, b_hi = float(vals.min()), float(vals.max())
        elif vals.size:
            b_lo, b_hi = float(vals.min()), float(vals.max())
        if not vals.size:
            continue
        if vals.dtype == np.float64:
            v64 = vals
        else:  # into this thread's block buffer: a fresh float64 array per block costs page faults
            v64 = thread_buffer("summarize-f64", _BLOCK, np.float64)[: vals.size]
            v64[...] = vals
        lo, hi = min(lo, b_lo), max(hi, b_hi)
        total += float(np.add.reduce(v64))
        ss += float(np.dot(v64, v64))
        n_fin += v64.size
    if n_fin == 0:
        return np.array([math.nan, math.nan, math.nan, 0.0, nans, infs, neg_infs], dtype=np.float64)
    return np.array([lo, hi, total / n_fin, math.sqrt(ss), nans, infs, neg_infs], dtype=np.float64)


def finite(summary: np.ndarray) -> bool:
    """Whether the tensor summarized holds no NaN and no Inf (exact for real and bit-stored
    floats and integers: their counts are exact; not for complex, whose magnitude can overflow)."""
    return summary[NAN] == 0 and summary[INF] == 0


def scalar_value(summary: np.ndarray) -> float:
    """The value of a one-element tensor from its summary: its mean, or +/-Inf or NaN as counted
    (NaN also for an Inf whose sign an older store did not record)."""
    if summary[NAN]:
        return math.nan
    if summary[INF]:
        neg = float(summary[NEG_INF])
        return math.nan if math.isnan(neg) else (-math.inf if neg else math.inf)
    return float(summary[MEAN])


def combine(parts: list[tuple[np.ndarray, int]]) -> np.ndarray:
    """The summary of a tensor held as pieces, from each piece's (summary, element count)."""
    if len(parts) == 1:
        return parts[0][0]
    nans = sum(float(s[NAN]) for s, _ in parts)
    infs = sum(float(s[INF]) for s, _ in parts)
    neg_infs = sum(float(s[NEG_INF]) for s, _ in parts)  # NaN (unknown) if any piece's is
    fin = [(s, n - int(s[NAN]) - int(s[INF])) for s, n in parts]
    fin = [(s, k) for s, k in fin if k > 0]
    if not fin:
        return np.array([math.nan, math.nan, math.nan, 0.0, nans, infs, neg_infs], dtype=np.float64)
    n_fin = sum(k for _, k in fin)
    return np.array([min(float(s[MIN]) for s, _ in fin), max(float(s[MAX]) for s, _ in fin),
                     sum(float(s[MEAN]) * k for s, k in fin) / n_fin,
                     math.sqrt(sum(float(s[L2]) ** 2 for s, _ in fin)), nans, infs, neg_infs], dtype=np.float64)
