"""Format 3: format 2 with each row's small tensors packed together (store/packs.py).

Read as format 2: where a tensor's bytes lie (its own object or its range of a pack) follows
from the row's hashes, the previous row's and the kind's `packs` attribute (RankView.locations),
so the one difference is in the pieces' Located, not in how they are read.
"""

from __future__ import annotations

from tracekit.store.formats.v2 import Objects
from tracekit.store.packs import PackSpec


class PackedObjects(Objects):
    version = 3

    def pack_spec(self):
        return PackSpec()
