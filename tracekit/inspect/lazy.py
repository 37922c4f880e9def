"""Dask arrays over a store's packed arrays: nothing is read until a value is computed.

One dask array per (rank, kind, packed array) is built on the zarr array itself; every tensor of
that array is a column slice of it, decoded (bfloat16 bits -> float32) block by block, and its
rows are the steps asked for, in order, with NaN rows where the rank has no such step.
"""

from __future__ import annotations

import uuid

import numpy as np

from tracekit.store.dtypes import storage_dtype, to_numpy_values
from tracekit.errors import StoreError, UsageError
from tracekit.store.chunks import first_missing_chunk


def require_dask():
    try:
        import dask.array as da
    except ImportError:  # dask is the optional extra `dask`
        raise UsageError("tracekit.open needs dask: pip install 'tracekit[dask]'") from None
    return da


def value_dtype(logical: str) -> np.dtype:
    """The numpy dtype a tensor reads as (bit-stored dtypes widen to float32)."""
    sdt = storage_dtype(logical)
    return np.dtype(np.float32) if logical != sdt.name else sdt


def _chunk_indices(k, n: int, width: int):
    """The chunk numbers along one axis (length n, chunks of `width`) that index k touches."""
    if isinstance(k, slice):
        r = range(*k.indices(n))
        return range(r[0] // width, r[-1] // width + 1) if len(r) else range(0)
    idx = np.asarray(k).reshape(-1)
    idx = np.where(idx < 0, idx + n, idx)
    return np.unique(idx // width).tolist()


class CheckedArray:
    """A zarr array whose read errors (a truncated, corrupt or missing chunk) surface as one StoreError line.

    A chunk file that does not exist is damage, not zeros: the writer writes every chunk, all-zero
    ones included (write_empty_chunks), while zarr 3.1 would silently read a missing one as fill
    values. So the chunk files a read needs are checked first, as RankView._require_chunks does.
    """

    def __init__(self, array, where: str):
        self.array = array
        self.where = where
        self.shape, self.dtype, self.ndim, self.chunks = array.shape, array.dtype, array.ndim, array.chunks

    def _require_chunks(self, key) -> None:
        key = key if isinstance(key, tuple) else (key,)
        key = key + (slice(None),) * (2 - len(key))
        rows = _chunk_indices(key[0], self.shape[0], self.chunks[0])
        cols = _chunk_indices(key[1], self.shape[1], self.chunks[1])
        missing = first_missing_chunk(self.array, rows, cols)
        if missing is not None:
            raise StoreError(f"{self.where}: unreadable data (chunk c/{missing[0]}/{missing[1]} is missing)")

    def __getitem__(self, key):
        self._require_chunks(key)
        try:
            return self.array[key]
        except StoreError:  # already one line naming the damage (format 2's hash checks)
            raise
        except Exception as e:
            raise StoreError(f"{self.where}: unreadable data ({e.__class__.__name__}: {e})") from None


def packed_dask(zarr_array, label: str, where: str):
    """A dask array over one packed zarr array, one dask chunk per zarr chunk; reads nothing now."""
    da = require_dask()
    # An explicit name spares dask hashing the zarr array; the uuid keeps two opens of one path
    # (say before and after the store was rewritten) from ever sharing a graph key.
    name = f"tracekit-{label}-{uuid.uuid4().hex}"
    return da.from_array(CheckedArray(zarr_array, where), chunks=zarr_array.chunks, name=name, asarray=False,
                         inline_array=True, meta=np.empty((0, 0), zarr_array.dtype))


def _runs(flags: list[bool]) -> list[tuple[int, int, bool]]:
    """Maximal runs [start, stop) of equal flags."""
    out = []
    start = 0
    for i in range(1, len(flags) + 1):
        if i == len(flags) or flags[i] != flags[start]:
            out.append((start, i, flags[start]))
            start = i
    return out


def tensor_rows(packed, info, rows: list[int | None]):
    """Tensor `info` at the given rows of its packed dask array, shaped (len(rows), *info.shape).

    A None row is a step this rank lacks: it reads as NaN (the result is then a float dtype);
    `packed` may be None when every row is None (a rank that never wrote this kind).
    """
    da = require_dask()
    dtype = value_dtype(info.dtype)
    present = [r is not None for r in rows]
    if not all(present):
        dtype = np.result_type(dtype, np.float32)
    pieces = []
    for start, stop, has in _runs(present):
        if has:
            span = slice(info.offset, info.offset + info.numel)
            idx = rows[start:stop]
            contiguous = idx == list(range(idx[0], idx[0] + len(idx)))
            # one dask slice where the rows are contiguous (building the graph is most of an open's time)
            part = packed[idx[0] : idx[-1] + 1, span] if contiguous else packed[:, span][idx]
            if info.dtype != storage_dtype(info.dtype).name:
                part = part.map_blocks(to_numpy_values, info.dtype, dtype=np.float32)
            pieces.append(part.astype(dtype, copy=False))
        else:
            pieces.append(da.full((stop - start, info.numel), np.nan, dtype=dtype))
    if not pieces:
        flat = da.zeros((0, info.numel), dtype=dtype)
    else:
        flat = pieces[0] if len(pieces) == 1 else da.concatenate(pieces, axis=0)
    return flat.reshape((len(rows), *info.shape))
