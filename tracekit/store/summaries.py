"""Per-tensor summaries (format v2): min, max, mean, L2 norm, NaN count, Inf count.

Every recorded tensor (or shard) gets one, whether or not its bytes are kept (`--full`): the
writer computes it from the bytes it hashes (the rank's writer process, on the CPU, from the
spooled bytes), and stores it beside the hash in the kind's `summary` index array, one float64
row of SUMMARY_FIELDS per tensor. min, max, mean and L2 are over the finite elements (NaN when
there is none, L2 then 0); complex tensors are summarized by their magnitudes, integer and bool
tensors as float64 (exact below 2**53).
"""

from __future__ import annotations

import math

import numpy as np
import xxhash

from tracekit.store.dtypes import to_numpy_values

SUMMARY_FIELDS = ("min", "max", "mean", "l2", "nan", "inf")
N_FIELDS = len(SUMMARY_FIELDS)
MIN, MAX, MEAN, L2, NAN, INF = range(N_FIELDS)
# A summary row ends in SEAL_SLOTS float64 slots holding the xxh3-128 of the values before them:
# a summary is read only where bytes are missing, so damage to it must show without the bytes.
SEAL_SLOTS = 2


def row_width(tensors: int) -> int:
    """float64 values in one summary row of a kind with this many tensors."""
    return N_FIELDS * tensors + SEAL_SLOTS


def seal(values: np.ndarray) -> np.ndarray:
    """A summary row: the flat float64 values, then their checksum."""
    values = np.ascontiguousarray(values, dtype=np.float64).reshape(-1)
    digest = np.frombuffer(xxhash.xxh3_128_digest(values.tobytes()), dtype=np.float64)
    return np.concatenate([values, digest])


def unseal(row: np.ndarray) -> np.ndarray | None:
    """The values of a summary row, shaped (tensors, N_FIELDS); None when its checksum does not match."""
    values, digest = row[:-SEAL_SLOTS], row[-SEAL_SLOTS:]
    if xxhash.xxh3_128_digest(np.ascontiguousarray(values).tobytes()) != np.ascontiguousarray(digest).tobytes():
        return None
    return values.reshape(-1, N_FIELDS)


# Elements summarized at a time: the float64 temporaries stay bounded whatever the tensor size.
_BLOCK = 1 << 20


def summarize(data: np.ndarray, dtype: str) -> np.ndarray:
    """The summary (float64[N_FIELDS]) of a flat tensor or shard `data` in storage dtype."""
    flat = np.ascontiguousarray(data).reshape(-1)
    lo, hi, total, ss, nans, infs, n_fin = math.inf, -math.inf, 0.0, 0.0, 0, 0, 0
    for start in range(0, flat.size, _BLOCK):
        vals = to_numpy_values(flat[start : start + _BLOCK], dtype)
        if vals.dtype.kind == "c":
            vals = np.where(np.isnan(vals), np.nan, np.abs(vals))  # a NaN part stays a NaN
        vals = vals.astype(np.float64, copy=False)
        with np.errstate(over="ignore", invalid="ignore"):
            block_sum = float(np.add.reduce(vals))
        if vals.dtype.kind == "f" and not math.isfinite(block_sum):  # a NaN/Inf (or overflow): look closer
            nan_mask = np.isnan(vals)
            inf_mask = np.isinf(vals)
            nans += int(nan_mask.sum())
            infs += int(inf_mask.sum())
            vals = vals[~(nan_mask | inf_mask)]
            block_sum = float(vals.sum())
        if vals.size:
            lo, hi = min(lo, float(vals.min())), max(hi, float(vals.max()))
            total += block_sum
            ss += float(np.dot(vals, vals))
            n_fin += vals.size
    if n_fin == 0:
        return np.array([math.nan, math.nan, math.nan, 0.0, nans, infs], dtype=np.float64)
    return np.array([lo, hi, total / n_fin, math.sqrt(ss), nans, infs], dtype=np.float64)


def combine(parts: list[tuple[np.ndarray, int]]) -> np.ndarray:
    """The summary of a tensor held as pieces, from each piece's (summary, element count)."""
    if len(parts) == 1:
        return parts[0][0]
    nans = sum(float(s[NAN]) for s, _ in parts)
    infs = sum(float(s[INF]) for s, _ in parts)
    fin = [(s, n - int(s[NAN]) - int(s[INF])) for s, n in parts]
    fin = [(s, k) for s, k in fin if k > 0]
    if not fin:
        return np.array([math.nan, math.nan, math.nan, 0.0, nans, infs], dtype=np.float64)
    n_fin = sum(k for _, k in fin)
    return np.array([min(float(s[MIN]) for s, _ in fin), max(float(s[MAX]) for s, _ in fin),
                     sum(float(s[MEAN]) * k for s, k in fin) / n_fin,
                     math.sqrt(sum(float(s[L2]) ** 2 for s, _ in fin)), nans, infs], dtype=np.float64)
