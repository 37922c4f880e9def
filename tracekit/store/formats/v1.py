"""Format 1: packed arrays. Each (rank, kind) holds one zarr array per storage dtype, shaped
(row, element), a row per recorded step; a tensor is the element range [offset, offset + numel)
of its array's row. No hashes, finiteness flags or summaries: a reader checks structure only.

Dropping format 1 one day is deleting this file and its line in formats/__init__.py.
"""

from __future__ import annotations

import numpy as np
from tracekit.errors import StoreError
from tracekit.store.chunks import chunk_cols, first_missing_chunk


class PackedArrays:
    version = 1
    hashed = False
    sealed_rows = False
    index_text = False
    chunk_separator = "/"

    def check_addresses(self, infos):
        return None  # addresses are real places in the packed arrays: any in-bounds one is valid

    def storage_array(self, view, kind: str, key: str):
        """The zarr array, its size claims checked against the files once per open store."""
        def opened():
            extents = [(i.name, i.offset, i.numel) for i in view.tensors(kind) if i.array == key]
            return view._checked_array(kind, key, extents)

        return view._once(view._packed_arrays, (kind, key), opened)

    def check_index_arrays(self, view, kind: str) -> None:
        for key in sorted({t.array for t in view.tensors(kind)}):
            self.storage_array(view, kind, key)

    def read_range(self, view, kind: str, step: int, key: str, start: int, stop: int) -> np.ndarray:
        row = view._row(kind, step)
        try:
            array = self.storage_array(view, kind, key)
            # zarr 3.1 silently returns fill values for a missing chunk; a store must never do that
            missing = first_missing_chunk(array, [row], chunk_cols(start, stop, array.chunks[1]))
            if missing is not None:
                raise FileNotFoundError(f"chunk c/{missing[0]}/{missing[1]} of {key} is missing")
            return array[row, start:stop]
        except Exception as e:  # a missing or corrupt chunk must surface as one line, not a zarr traceback
            raise StoreError(
                f"{view.store.path}: rank {view.rank} {kind} step {step}: unreadable data ({e.__class__.__name__}: {e})"
            ) from None

    def whole_piece(self, view, kind: str, step: int, info):
        return None  # a tensor is a range of a packed row, not a piece of its own

    def kind_writer(self, group, kind: str, io_root, full, rank: int):
        from tracekit.store.writer import _KindWriter

        return _KindWriter(group, kind)

    def read_span(self, view, kind: str, step: int, info, start: int, stop: int) -> np.ndarray:
        return self.read_range(view, kind, step, info.array, info.offset + start, info.offset + stop)

    def fetch(self, view, kind: str, step: int, item, span=None) -> np.ndarray:
        raise TypeError("format 1 saves no pieces to fetch")

