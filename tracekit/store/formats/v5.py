"""Format 5: format 4 with each kind's tensor index stored as one JSON text (meta.encode_index)
instead of a list of entries. The entries are the same; only their container differs.

Why: zarr's consolidation (finalize) copies every attribute of every node into the root, and
zarr 3.1 does it with `dataclasses.asdict`, which deep-copies a list of entries element by element
in Python: at 2000 tensors 0.26 of the consolidation's 0.31 s under cProfile (docs/RELIABILITY.md,
Tensor count). A string is copied whole and encoded by json in C, so consolidation grows with the
index's bytes, not its entries. A version of its own because a reader of format 4 would take the
text for a malformed index and call the store damaged: with it, such a reader refuses the store
in one line instead.
"""

from __future__ import annotations

from tracekit.store.formats.v4 import SealedRows


class IndexText(SealedRows):
    version = 5
    index_text = True
