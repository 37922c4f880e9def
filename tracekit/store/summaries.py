"""Per-tensor summaries (format v2): min, max, mean, L2 norm, NaN count, Inf count, -Inf count.

Every recorded tensor (or shard) gets one, whether or not its bytes are kept (`--full`),
computed on the CPU in the same pass as its hash (digest_and_summary): by the rank's writer
process from the spooled bytes, or, for a tensor whose bytes are not kept, by the rank itself
(recorders/direct.py, Recorder._spooled_entries), which then sends no bytes. The writer stores
it beside the hash in the kind's `summary` index array, one float64 row of SUMMARY_FIELDS per
tensor; both compute it with the same code, bit for bit. min, max, mean and L2 are over the finite elements (NaN when
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


def row_identity(rank: int, kind: str, step: int) -> bytes:
    """What a format-4 row's seal binds it to besides its values: its rank, kind and step (the
    content hashes leave them out, so that equal tensors share one object)."""
    return f"tracekit row\0rank {int(rank)}\0{kind}\0step {int(step)}\0".encode()


def _seal_digest(values: np.ndarray, bound: bytes) -> bytes:
    h = xxhash.xxh3_128(bound)
    h.update(np.ascontiguousarray(values).tobytes())
    return h.digest()


def seal(values: np.ndarray, bound: bytes = b"") -> np.ndarray:
    """A summary row: the flat float64 values, then their checksum. Format 4 (`bound`: the row's
    row_identity() and its hash and finiteness rows' bytes) seals the whole index row to its place:
    a row read under another rank, kind or step, or beside another row's hashes, fails unseal()."""
    values = np.ascontiguousarray(values, dtype=np.float64).reshape(-1)
    digest = np.frombuffer(_seal_digest(values, bound), dtype=np.float64)
    return np.concatenate([values, digest])


def unseal(row: np.ndarray, fields: int = N_FIELDS, bound: bytes = b"") -> np.ndarray | None:
    """The values of a summary row of `fields` per tensor, shaped (tensors, N_FIELDS) (a legacy
    row's neg_inf NaN: unknown); None when its checksum does not match (`bound`: as seal() was given)."""
    values, digest = row[:-SEAL_SLOTS], row[-SEAL_SLOTS:]
    if _seal_digest(values, bound) != np.ascontiguousarray(digest).tobytes():
        return None
    values = values.reshape(-1, fields)
    if fields < N_FIELDS:
        values = np.concatenate([values, np.full((values.shape[0], N_FIELDS - fields), math.nan)], axis=1)
    return values


# Elements summarized at a time: the float64 copy of a block stays in the CPU's cache, so the
# passes over it after the first cost little, and the temporaries stay bounded whatever the size.
BLOCK = 1 << 16
# The sum of squares is taken by BLAS dots of at most this many elements: OpenBLAS computes a dot of
# up to 10,000 elements on the calling thread, and a longer one split over its threads, whose
# partial sums then depend on the thread count (a rank and its writer process differ: the summary
# of the same bytes would differ in its last bits) and whose threads spin on the training's cores.
_DOT = 8192


_MIN, _MAX, _SUM = np.minimum.reduce, np.maximum.reduce, np.add.reduce
# numpy >= 2: the dots of a block's rows of _DOT elements in one call, each the BLAS dot np.dot
# takes of that row (the same bits): 6 against 14 us a block here, where the loop's Python was most of it
_VECDOT = getattr(np, "vecdot", None)


def _sum_of_squares(ss: float, v64: np.ndarray) -> float:
    """`ss` plus the squares of float64 `v64`, added as the dots of its consecutive _DOT-element parts, in order."""
    rows = v64.size // _DOT if _VECDOT is not None else 0
    if rows:
        whole = v64[: rows * _DOT].reshape(rows, _DOT)
        for part in _VECDOT(whole, whole).tolist():
            ss += part
    for start in range(rows * _DOT, v64.size, _DOT):
        part = v64[start : start + _DOT]
        ss += float(np.dot(part, part))
    return ss


def _block_buffer() -> np.ndarray:
    """This thread's float64 block buffer, made once."""
    return thread_buffer("summarize-f64", BLOCK, np.float64)


class Summarizer:
    """The summary of one tensor fed as consecutive blocks of its flat data in storage dtype
    (add(), then result()). Blocks of BLOCK elements (the last one shorter) give bit for bit the
    summary summarize() gives: the float64 sums are accumulated block by block, in order.

    Per block: min and max in the values' own dtype (exact, and a NaN or Inf makes one of them
    non-finite, so they double as the check for those), then sum and sum of squares of the
    block's float64 copy."""

    __slots__ = ("dtype", "lo", "hi", "total", "ss", "nans", "infs", "neg_infs", "n_fin")

    def __init__(self, dtype: str):
        self.dtype = dtype
        self.lo, self.hi, self.total, self.ss = math.inf, -math.inf, 0.0, 0.0
        self.nans = self.infs = self.neg_infs = self.n_fin = 0

    def add(self, block: np.ndarray) -> None:
        vals = to_numpy_values(block, self.dtype)
        if vals.dtype.kind == "c":
            vals = np.where(np.isnan(vals), np.nan, np.abs(vals))  # a NaN part stays a NaN
        if vals.dtype.kind == "f":
            with np.errstate(invalid="ignore"):
                b_lo, b_hi = float(_MIN(vals)), float(_MAX(vals))
            if not (math.isfinite(b_lo) and math.isfinite(b_hi)):  # a NaN or an Inf: look closer
                nan_mask, inf_mask = np.isnan(vals), np.isinf(vals)
                self.nans += int(np.count_nonzero(nan_mask))
                self.infs += int(np.count_nonzero(inf_mask))
                self.neg_infs += int(np.count_nonzero(inf_mask & (vals < 0)))
                vals = vals[~(nan_mask | inf_mask)]
                if not vals.size:
                    return
                b_lo, b_hi = float(vals.min()), float(vals.max())
        elif vals.size:
            b_lo, b_hi = float(vals.min()), float(vals.max())
        if not vals.size:
            return
        if vals.dtype == np.float64:
            v64 = vals
        else:  # into this thread's block buffer: a fresh float64 array per block costs page faults
            v64 = _block_buffer()[: vals.size]
            v64[...] = vals
        self.lo, self.hi = min(self.lo, b_lo), max(self.hi, b_hi)
        self.total += float(_SUM(v64))
        self.ss = _sum_of_squares(self.ss, v64)
        self.n_fin += v64.size

    def result(self) -> np.ndarray:
        if self.n_fin == 0:
            return np.array([math.nan, math.nan, math.nan, 0.0, self.nans, self.infs, self.neg_infs], dtype=np.float64)
        return np.array([self.lo, self.hi, self.total / self.n_fin, math.sqrt(self.ss), self.nans, self.infs,
                         self.neg_infs], dtype=np.float64)


def blocks(data: np.ndarray):
    """The flat data in the blocks Summarizer expects."""
    flat = np.ascontiguousarray(data).reshape(-1)
    for start in range(0, flat.size, BLOCK):
        yield flat[start : start + BLOCK]


def _summary_of(parts, dtype: str) -> np.ndarray:
    acc = Summarizer(dtype)
    for block in parts:
        acc.add(block)
    return acc.result()


def summarize(data: np.ndarray, dtype: str) -> np.ndarray:
    """The summary (float64[N_FIELDS]) of a flat tensor or shard `data` in storage dtype."""
    return _summary_of(blocks(data), dtype)


def digest_and_summary(ident: bytes, parts, dtype: str) -> tuple[bytes, np.ndarray]:
    """The content hash (hashing.digest_of) and the summary of a tensor, in one pass: each block
    is hashed, then summarized while it is still in the CPU's cache (one read of the bytes from
    memory instead of two; bench: 92 against 111 ms per 200 MB of float32 here). `parts`: the flat data in
    storage dtype, or an iterable of its blocks as blocks() cuts it (e.g. computed block by block)."""
    h = xxhash.xxh3_128(ident)
    acc = Summarizer(dtype)
    for block in blocks(parts) if isinstance(parts, np.ndarray) else parts:
        if block.size:
            h.update(memoryview(block).cast("B"))
        acc.add(block)
    return h.digest(), acc.result()


class DigestCache:
    """Hashes and summaries of a fixed list of tensors written step after step (a kind's tensors).

    A tensor whose bytes did not change from one step to the next (a frozen parameter, its zero
    delta) is from then on hashed first, and its summary reused for as long as the hash stays the
    same: one fast pass instead of the summary's slower one. The others are hashed and summarized
    together (digest_and_summary)."""

    def __init__(self):
        self._last: dict = {}  # slot -> (digest, summary, unchanged at its last step)

    def get(self, slot, ident: bytes, parts, dtype: str) -> tuple[bytes, np.ndarray]:
        """`parts`: the flat data in storage dtype, or a callable giving an iterable of its blocks
        (called once or twice)."""
        feed = (lambda: blocks(parts)) if isinstance(parts, np.ndarray) else parts
        last = self._last.get(slot)
        if last is not None and last[2]:
            h = xxhash.xxh3_128(ident)
            for block in feed():
                if block.size:
                    h.update(memoryview(block).cast("B"))
            digest = h.digest()
            if digest == last[0]:
                return digest, last[1]
            summary = _summary_of(feed(), dtype)  # it changed: its hash is known, its summary is not
        else:
            digest, summary = digest_and_summary(ident, feed(), dtype)
        self._last[slot] = (digest, summary, last is not None and digest == last[0])
        return digest, summary


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
