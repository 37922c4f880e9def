"""One rank's tensor over its steps, read by (steps, flat element range): the store's logical read
for lazy readers (the xarray backend, tracekit/inspect/backend.py), which know no rows or chunks.

Reads are checked as every reader's are: a truncated, corrupt or missing chunk (format 1) or an
object whose bytes do not match its hash (formats 2 and 3) is one StoreError line.
"""

from __future__ import annotations

import numpy as np

from tracekit.errors import StoreError
from tracekit.store.chunks import first_missing_chunk


def _chunk_indices(k, n: int, width: int):
    """The chunk numbers along one axis (length n, chunks of `width`) that index k touches."""
    if isinstance(k, slice):
        r = range(*k.indices(n))
        return range(r[0] // width, r[-1] // width + 1) if len(r) else range(0)
    idx = np.asarray(k).reshape(-1)
    idx = np.where(idx < 0, idx + n, idx)
    return np.unique(idx // width).tolist()


class CheckedArray:
    """A storage array whose read errors (a truncated, corrupt or missing chunk) surface as one StoreError line.

    A chunk file that does not exist is damage, not zeros: the writer writes every chunk, all-zero
    ones included (write_empty_chunks), while zarr 3.1 would silently read a missing one as fill
    values. So the chunk files a read needs are checked first, as RankView._require_chunks does.
    """

    def __init__(self, array, where: str):
        self.array = array
        self.where = where
        self.shape, self.dtype, self.chunks = array.shape, array.dtype, array.chunks

    def _require_chunks(self, rows, cols) -> None:
        missing = first_missing_chunk(self.array, _chunk_indices(rows, self.shape[0], self.chunks[0]),
                                      _chunk_indices(cols, self.shape[1], self.chunks[1]))
        if missing is not None:
            raise StoreError(f"{self.where}: unreadable data (chunk c/{missing[0]}/{missing[1]} is missing)")

    def __getitem__(self, key: tuple[slice, slice]) -> np.ndarray:
        self._require_chunks(*key)
        try:
            return self.array[key]
        except StoreError:  # already one line naming the damage (format 2's hash checks)
            raise
        except Exception as e:
            raise StoreError(f"{self.where}: unreadable data ({e.__class__.__name__}: {e})") from None


def _runs(rows: list[int]) -> list[tuple[int, int]]:
    """[start, stop) positions in `rows` of its maximal runs of consecutive rows."""
    out, start = [], 0
    for i in range(1, len(rows) + 1):
        if i == len(rows) or rows[i] != rows[i - 1] + 1:
            out.append((start, i))
            start = i
    return out


class TensorSteps:
    """Tensor `name` of `kind` on one rank, at the steps the rank completed (`steps`).

    Made at open: the tensor's storage array is opened and its size claims checked then (a lying
    index is one StoreError line before anything is read), as tracekit.open always did."""

    def __init__(self, view, kind: str, name: str):
        self.info = view.tensor(kind, name)
        self.dtype: str = self.info.dtype  # logical: float32, bfloat16, ...
        self.shape: tuple[int, ...] = self.info.shape
        self._row_of = view.rows(kind)
        self.steps: tuple[int, ...] = tuple(self._row_of)
        array = view.array(kind, self.info.array)
        self._array = CheckedArray(array, f"{view.store.path}: rank {view.rank} {kind}/{self.info.array}")

    def holds(self, step: int) -> bool:
        return step in self._row_of

    def read(self, steps, start: int = 0, stop: int | None = None) -> np.ndarray:
        """Flat elements [start, stop) at each of `steps` (steps this rank has), in storage dtype
        (bfloat16 as its uint16 bits; tracekit.store.dtypes.to_numpy_values decodes), shaped
        (len(steps), stop - start). Consecutive steps are read in one request."""
        stop = self.info.numel if stop is None else stop
        rows = [self._row_of[s] for s in steps]
        cols = slice(self.info.offset + start, self.info.offset + stop)
        out = np.empty((len(rows), max(0, stop - start)), dtype=self._array.dtype)
        for a, b in _runs(rows):
            out[a:b] = self._array[slice(rows[a], rows[b - 1] + 1), cols]
        return out
