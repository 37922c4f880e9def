"""Format 2: content-addressed objects. A tensor's bytes (or a rank's piece of a sharded tensor)
live once per content at objects/<2 hex>/<30 hex>, shared by every rank and step that holds
them; each (rank, kind) holds index arrays, one row per recorded step: each tensor's hash, its
finiteness flag and (since summaries exist) its summary. Every byte read is checked against its
hash (once per open store) and its finiteness flag.
"""

from __future__ import annotations

import numpy as np

from tracekit.store.format import FINITE_ARRAY, HASH_ARRAY, SUMMARY_ARRAY
from tracekit.store.meta import misplaced
from tracekit.store.objects import ObjectRows


class Objects:
    version = 2
    hashed = True
    sealed_rows = False
    index_text = False
    chunk_separator = "/"

    def check_addresses(self, infos):
        # addresses are virtual (tensors live in objects): they follow from the names, dtypes and
        # shapes, so any other value is damage, not a place to read from
        return misplaced(infos)

    def storage_array(self, view, kind: str, key: str):
        """The rows of tensors of one storage dtype, read from their objects (store/objects.py)."""
        def rows():
            if key not in {t.array for t in view.tensors(kind)}:
                raise KeyError(key)
            return ObjectRows(view, kind, key)

        return view._once(view._object_rows, (kind, key), rows)

    def check_index_arrays(self, view, kind: str) -> None:
        for name in (HASH_ARRAY, FINITE_ARRAY) + ((SUMMARY_ARRAY,) if view.has_summaries(kind) else ()):
            view._index_array(kind, name)

    def read_range(self, view, kind: str, step: int, key: str, start: int, stop: int) -> np.ndarray:
        row = view._row(kind, step)
        arr = self.storage_array(view, kind, key)
        return arr.read_into(row, start, stop, np.empty(stop - start, dtype=arr.dtype))

    def whole_piece(self, view, kind: str, step: int, info):
        return view._object_piece(kind, step, info.name)

    def pack_spec(self):
        """How a new kind's small tensors are packed (format 3, store/packs.py); None: not at all."""
        return None

    def kind_writer(self, group, kind: str, io_root, full, rank: int):
        from tracekit.store.writer import _ObjectKindWriter

        return _ObjectKindWriter(group, kind, io_root, full, self.pack_spec(), rank if self.sealed_rows else None,
                                 self.index_text, self.chunk_separator)

    def read_span(self, view, kind: str, step: int, info, start: int, stop: int) -> np.ndarray:
        raise TypeError("format 2 saves every tensor as pieces: read them (fetch)")

    def fetch(self, view, kind: str, step: int, item, span=None) -> np.ndarray:
        """The piece's object (or its range of a pack), hash-checked once per open store, and its
        finiteness flag checked against what the bytes say."""
        return view.read_piece(kind, step, item.source, span)
