"""One reader per store format version, behind one protocol (base.FormatReader), picked once
when a store opens. Adding a format is a module here and its line below (and its writer)."""

from __future__ import annotations

from tracekit.errors import StoreError
from tracekit.store.formats.base import FormatReader
from tracekit.store.formats.v1 import PackedArrays
from tracekit.store.formats.v2 import Objects
from tracekit.store.formats.v3 import PackedObjects
from tracekit.store.formats.v4 import SealedRows
from tracekit.store.formats.v5 import IndexText
from tracekit.store.formats.v6 import FlatChunks

READERS: dict[int, FormatReader] = {r.version: r for r in (PackedArrays(), Objects(), PackedObjects(), SealedRows(), IndexText(), FlatChunks())}
NEWEST = max(READERS)


def reader_for(version, path: str) -> FormatReader:
    """The reader of a store of this format version; StoreError naming the store otherwise."""
    if not isinstance(version, int):
        raise StoreError(f"{path}: tracekit metadata has no format version (half-written store?)")
    if version > NEWEST:
        raise StoreError(f"{path} has store format {version}, newer than this tracekit reads ({NEWEST}); upgrade tracekit")
    reader = READERS.get(version)
    if reader is None:
        raise StoreError(f"{path} has store format {version}, which no tracekit wrote (damaged store?)")
    return reader


__all__ = ["FormatReader", "READERS", "reader_for"]
