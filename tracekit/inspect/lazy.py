"""Dask arrays over a store's packed arrays: nothing is read until a value is computed.

One dask array per (rank, kind, packed array) is built on the zarr array itself; every tensor of
that array is a column slice of it, decoded (bfloat16 bits -> float32) block by block, and its
rows are the steps asked for, in order, with NaN rows where the rank has no such step.
"""

from __future__ import annotations

import uuid

import numpy as np

from tracekit.dtypes import storage_dtype, to_numpy_values
from tracekit.errors import StoreError, UsageError


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


class CheckedArray:
    """A zarr array whose read errors (a truncated or corrupt chunk) surface as one StoreError line.

    A chunk file that does not exist reads as zeros, as zarr intends: the writer's zarr skips
    chunks that are all fill value (0), so an absent chunk is a legitimate all-zero row.
    """

    def __init__(self, array, where: str):
        self.array = array
        self.where = where
        self.shape, self.dtype, self.ndim, self.chunks = array.shape, array.dtype, array.ndim, array.chunks

    def __getitem__(self, key):
        try:
            return self.array[key]
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
            cols = packed[:, info.offset : info.offset + info.numel]
            idx = rows[start:stop]
            contiguous = idx == list(range(idx[0], idx[0] + len(idx)))
            part = cols[idx[0] : idx[-1] + 1] if contiguous else cols[idx]
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
