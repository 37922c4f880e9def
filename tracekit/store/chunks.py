"""Where a packed array's chunk files live (format v1 and v2 index arrays), and which are missing.

zarr 3.1 reads a missing chunk as fill values; tracekit writes every chunk (all-zero ones too), so
a missing chunk file is damage, and every reader checks for it through this one rule.
"""

from __future__ import annotations

from typing import Iterable

import zarr

from tracekit.store import io


def chunk_key(array: zarr.Array, row: int, col: int) -> str:
    """The key of chunk (row, col) of an array, relative to the store root (default `c/<row>/<col>` keys)."""
    return f"{array.store_path.path}/{array.metadata.encode_chunk_key((row, col))}"


def chunk_path(array: zarr.Array, row: int, col: int) -> str:
    """The file of chunk (row, col) of a local store's array."""
    root, _ = io.array_key(array)
    return io.local_path(root, chunk_key(array, row, col))


def chunk_cols(start: int, stop: int, width: int) -> range:
    """The chunk columns holding elements [start, stop) of a row split into chunks of `width`."""
    return range(start // width, (max(stop, start + 1) - 1) // width + 1)


def first_missing_chunk(array, rows: Iterable[int], cols: Iterable[int]) -> tuple[int, int] | None:
    """The first (row, col) among rows x cols whose chunk file does not exist; None if all do.

    Stores that are not local folders, and format v2's virtual packed arrays (which check their
    objects' hashes instead), are not checked here (None)."""
    where = io.array_key(array) if isinstance(array, zarr.Array) else None
    if where is None:
        return None
    cols = list(cols)
    for i in rows:
        for j in cols:
            if not io.exists(where[0], chunk_key(array, i, j)):
                return i, j
    return None
