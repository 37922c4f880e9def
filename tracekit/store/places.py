"""Where a recorded tensor's bytes and its index rows lie, for tools that look at files (and tests
that damage them on purpose): the store's answer, so that no one else works it out from rows,
packs, objects or chunk keys."""

from __future__ import annotations

import os

from tracekit.store.format import RANK_PREFIX
from tracekit.store.packs import Located


def located(view, kind: str, step: int, name: str) -> Located:
    """Where tensor `name`'s bytes on rank `view` lie at `step` (formats 2-4): its own object, or
    its range of a pack (store/packs.py Located: key below the store, base, length)."""
    return view._locate(kind, step, name)


def tensor_bytes(store, rank: int, kind: str, step: int, name: str) -> tuple[str, int, int]:
    """(the file, the offset of its first byte there, its length) of one tensor's bytes in a local
    format 2-4 store at path `store`: the tensor's own object, or the pack it shares with other
    small tensors (docs/FORMAT.md)."""
    from tracekit.store.reader import open_store

    view = open_store(os.fspath(store)).rank(rank)
    loc = located(view, kind, step, name)
    length = loc.length if loc.length is not None else view.tensor(kind, name).stored_nbytes
    return os.path.join(os.fspath(store), *loc.key.split("/")), loc.base, length


def index_chunk(store, rank: int, kind: str, array: str, row: int, col: int = 0) -> str:
    """The chunk file of row `row` (column `col`) of one of a local store's row arrays (`hash`,
    `finite`, `summary`, or format 1's packed `float32`, ...), at the key the array's own metadata
    gives it (`c/<row>/<col>`; format 6 `c.<row>.<col>`)."""
    import zarr

    from tracekit.store.chunks import chunk_path

    arr = zarr.open_array(store=os.fspath(store), path=f"{RANK_PREFIX}{rank}/{kind}/{array}", mode="r")
    return chunk_path(arr, row, col)
