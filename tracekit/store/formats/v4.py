"""Format 4: format 3 with each index row sealed to its rank, kind and step
(summaries.row_identity): a row copied from another rank, kind or step reads as damage.
"""

from __future__ import annotations

from tracekit.store.formats.v3 import PackedObjects


class SealedRows(PackedObjects):
    version = 4
    sealed_rows = True
