"""Where a packed array's chunk files live, and which of them are missing.

zarr 3.1 reads a missing chunk as fill values; tracekit writes every chunk (all-zero ones too), so
a missing chunk file is damage, and every reader checks for it through this one rule.
"""

from __future__ import annotations

import os
from typing import Iterable

import zarr


def chunk_path(array: zarr.Array, row: int, col: int) -> str:
    """The file of chunk (row, col) of a local store's array (default `c/<row>/<col>` keys)."""
    return os.path.join(os.fspath(array.store.root), array.path, "c", str(row), str(col))


def chunk_cols(start: int, stop: int, width: int) -> range:
    """The chunk columns holding elements [start, stop) of a row split into chunks of `width`."""
    return range(start // width, (max(stop, start + 1) - 1) // width + 1)


def first_missing_chunk(array: zarr.Array, rows: Iterable[int], cols: Iterable[int]) -> tuple[int, int] | None:
    """The first (row, col) among rows x cols whose chunk file (or object) does not exist; None if all do."""
    cols = list(cols)
    local = getattr(array.store, "root", None) is not None
    for i in rows:
        for j in cols:
            if not (os.path.isfile(chunk_path(array, i, j)) if local else _object_exists(array, i, j)):
                return i, j
    return None


def _object_exists(array: zarr.Array, row: int, col: int) -> bool:
    """Whether a chunk object exists in a non-local store (an object store: one HEAD request)."""
    from zarr.core.sync import sync

    key = f"{array.path}/{array.metadata.encode_chunk_key((row, col))}" if array.path else array.metadata.encode_chunk_key((row, col))
    return bool(sync(array.store.exists(key)))
