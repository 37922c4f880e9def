"""Where a store's objects are read and written: one protocol, a local folder and an object store
behind it, chosen once from the store's location. What differs between them is declared as
capability flags, not found out by asking where the store is.
"""

from __future__ import annotations

import os
from typing import Iterable, Protocol

from tracekit.store.local_bytes import LocalBytes
from tracekit.store.object_bytes import ObjectBytes


class ByteStore(Protocol):
    direct_io: bool  # large objects may be written around the page cache
    atomic_rename: bool  # objects are written under a temporary name, then renamed over their key
    conditional_create: bool  # an object can be created only if absent
    listing: bool  # keys can be listed
    read_hints: bool  # reads can be announced ahead (prefetch does something)
    batch_writes: bool  # a step's objects are best written together, not one by one as they are made

    def exists(self, key: str) -> bool: ...

    def size(self, key: str) -> int | None:
        """The object's size in bytes; None when there is none."""

    def reader(self, key: str, whole: int | None = None, ranged: bool = False):
        """Positional reads of one object (size(), readinto(offset, view), prefetch(offset, length), close()).
        ranged: the caller's first read comes at once and says whether the object exists (no check before)."""

    def write_objects(self, items, direct=None) -> int:
        """Write each (key, parts) unless its key exists; the number newly written."""

    def prefetch(self, spans: Iterable[tuple[str, int, int | None]]) -> None:
        """Hint (object key, first byte, length or None) reads to come."""

    def direct_writes(self):
        """A Direct (tracekit/store/local_bytes.py) deciding which writes bypass the page cache, or None."""


def byte_store(root) -> ByteStore:
    """The ByteStore of a store root: a local folder (a path or a local Location), a URL's Location,
    or a ByteStore already chosen (returned as it is). A Location is os.PathLike even for a URL
    (its __fspath__ refuses), so it is asked whether it is local, not type-checked."""
    if isinstance(root, (LocalBytes, ObjectBytes)):
        return root
    if getattr(root, "is_local", True):
        return LocalBytes(getattr(root, "path", None) or os.fspath(root))
    return ObjectBytes(root)
