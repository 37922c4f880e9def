"""Where a packed array's chunk files live (format v1 and v2 index arrays), and which are missing.

zarr 3.1 reads a missing chunk as fill values; tracekit writes every chunk (all-zero ones too), so
a missing chunk file is damage, and every reader checks for it through this one rule.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Iterable

from tracekit.store import io

if TYPE_CHECKING:  # not at import: training ranks import the writer (and this) but never open an array
    import zarr


def default_key(sep: str, row: int, col: int) -> str:
    """Zarr's default key of chunk (row, col) within its array's folder, with separator `sep`:
    `c/<row>/<col>`, or format 6's `c.<row>.<col>` (what encode_chunk_key gives, without zarr)."""
    return f"c{sep}{row}{sep}{col}"


def chunk_key(array: zarr.Array, row: int, col: int) -> str:
    """The key of chunk (row, col) of an array, relative to the store root (zarr's default keys:
    `c/<row>/<col>`, or format 6's `c.<row>.<col>`, as the array's metadata says)."""
    return f"{array.store_path.path}/{array.metadata.encode_chunk_key((row, col))}"


def chunk_path(array: zarr.Array, row: int, col: int) -> str:
    """The file of chunk (row, col) of a local store's array."""
    root, _ = io.array_key(array)
    return io.local_path(root, chunk_key(array, row, col))


def chunk_cols(start: int, stop: int, width: int) -> range:
    """The chunk columns holding elements [start, stop) of a row split into chunks of `width`."""
    return range(start // width, (max(stop, start + 1) - 1) // width + 1)


def first_missing_chunk(array, rows: Iterable[int], cols: Iterable[int],
                        listed: frozenset[str] | None = None) -> tuple[int, int] | None:
    """The first (row, col) among rows x cols whose chunk file (or object) does not exist; None if all do.

    Format 2's views over content-addressed objects are not zarr arrays: their objects' hashes
    are checked instead (None here). `listed`: chunk keys an earlier listing of the array found
    (listed_chunks): one of them is taken as there without a request; any other is asked for."""
    import zarr

    if not isinstance(array, zarr.Array):
        return None
    cols = list(cols)
    local = getattr(array.store, "root", None) is not None
    for i in rows:
        for j in cols:
            if local:
                if not io.exists(*_root_and_key(array, i, j)):
                    return i, j
            elif not (listed is not None and _object_key(array, i, j) in listed) and not _object_exists(array, i, j):
                return i, j
    return None


# An object store's array is listed (one LIST request a page of up to 1000 keys) instead of asked
# about chunk by chunk (a HEAD each) when it has at most this many chunks.
LIST_CHUNKS_UP_TO = 1000


def listed_chunks(array) -> frozenset[str] | None:
    """The chunk keys of an object store's array, in one listing (as first_missing_chunk's `listed`),
    where it has at most LIST_CHUNKS_UP_TO chunks; None for a local array, a larger one or a failed
    listing (each chunk is then asked about). A reader that reads several rows of an array asks once
    instead of once a row; a row written after the listing is asked about, as before."""
    import zarr
    from zarr.core.sync import sync

    if not isinstance(array, zarr.Array) or getattr(array.store, "root", None) is not None or array.ndim != 2:
        return None
    rows = -(-array.shape[0] // max(1, array.chunks[0]))
    cols = -(-array.shape[1] // max(1, array.chunks[1]))
    if rows * cols > LIST_CHUNKS_UP_TO:
        return None
    # the keys' common start: "c/" for zarr's default keys, "c." with the separator "." (format 6)
    prefix = array.metadata.encode_chunk_key((0, 0))[:2]
    prefix = f"{array.path}/{prefix}" if array.path else prefix

    async def keys():
        return frozenset([k async for k in array.store.list_prefix(prefix)])

    try:
        return sync(keys())
    except Exception:
        return None


def _root_and_key(array: zarr.Array, row: int, col: int) -> tuple[str, str]:
    root, _ = io.array_key(array)
    return root, chunk_key(array, row, col)


def check_size_claims(array: zarr.Array, listed_rows: int, extents: Iterable[tuple[str, int, int]]) -> str | None:
    """What is wrong (one phrase) when an array's metadata claims more than its files hold; None if sound.

    Run before anything is allocated or a task graph is built over the array: a lying shape of
    2**40 elements must be a one-line error, not minutes of graph building and gigabytes of memory.
    `extents` are (tensor name, offset, numel) of the tensors the index places in this array.
    """
    if array.ndim != 2:
        return f"has {array.ndim} dimensions, not 2"
    rows, width = array.shape
    if array.chunks[0] != 1 or array.chunks[1] < 1:  # the writer makes one chunk row per step
        return f"has chunks of shape {tuple(array.chunks)}, not one row each"
    if listed_rows > rows:
        return f"lists {listed_rows} rows but holds {rows}"
    for name, offset, numel in extents:
        if offset + numel > width:
            return f"is {width} elements wide, but the index puts tensor {name!r} at {offset}..{offset + numel}"
    root = getattr(array.store, "root", None)
    if root is None or array.compressors or array.shards is not None or rows == 0 or width == 0:
        return None  # only plain local chunk files have a size that can be checked here
    per_row = -(-width // array.chunks[1])
    first_key = array.metadata.encode_chunk_key((0, 0))
    try:
        listing = _chunk_listing(os.path.join(os.fspath(root), array.path), first_key[1:2])
    except OSError:
        return None  # missing chunks are reported, with their names, when read
    if listing is None:
        return None  # keys of another shape than zarr's default: checked when read
    with_files, row0_cols = listing
    # A claim is a lie when the files it implies at its far end do not exist and too few exist at all;
    # a chunk missing in the middle is left to the missing-chunk rule, which names the file.
    # (A crash between resizing and writing a row leaves the last row without files.)
    if rows > len(with_files) + 1 and rows - 2 not in with_files:
        return f"claims {rows} rows but has chunk files for {len(with_files)}"
    if row0_cols and per_row > len(row0_cols) and per_row - 1 not in row0_cols:
        return f"claims {per_row} chunks per row but row 0 has {len(row0_cols)} chunk files"
    first = chunk_path(array, 0, 0)
    if 0 in row0_cols and os.path.isfile(first):
        expected = array.chunks[1] * array.dtype.itemsize
        if os.path.getsize(first) != expected:
            return f"claims chunks of {expected} bytes but chunk {first_key} holds {os.path.getsize(first)}"
    return None


def _chunk_listing(folder: str, sep: str) -> tuple[set[int], set[int]] | None:
    """(the rows that have chunk files, the columns of row 0's) of a local 2-d array at zarr's default
    keys: for `c.<row>.<col>` (separator ".") one listing of the array's folder; for `c/<row>/<col>`
    one of `c/` (a row's folder stands for its files) and one of `c/0/`. None for another separator;
    OSError when the folder cannot be listed."""
    if sep == ".":
        rows, row0_cols = set(), set()
        for name in os.listdir(folder):
            parts = name.split(".")
            if len(parts) == 3 and parts[0] == "c" and parts[1].isdigit() and parts[2].isdigit():
                row = int(parts[1])
                rows.add(row)
                if row == 0:
                    row0_cols.add(int(parts[2]))
        return rows, row0_cols
    if sep != "/":
        return None
    base = os.path.join(folder, "c")
    rows = {int(d) for d in os.listdir(base) if d.isdigit()}
    row0 = os.path.join(base, "0")
    return rows, ({int(c) for c in os.listdir(row0) if c.isdigit()} if os.path.isdir(row0) else set())


def irregular_metadata(group: zarr.Group, children: Iterable[str] | None = None, depth: int = 0) -> str | None:
    """The first `zarr.json` below a local group (its children's, or the named children's; with
    depth 1, their children's too) that exists but is not a regular file: zarr would block forever
    reading a FIFO, or read a device without end."""
    root = getattr(group.store, "root", None)
    if root is None:
        return None
    return _irregular_below(os.path.join(os.fspath(root), group.path), group.path, children, depth)


def _irregular_below(base: str, path: str, children: Iterable[str] | None, depth: int) -> str | None:
    try:
        names = list(children) if children is not None else os.listdir(base)
    except OSError:
        return None
    for name in names:
        here = os.path.join(base, name)
        meta = os.path.join(here, "zarr.json")
        if os.path.lexists(meta) and not os.path.isfile(meta):
            return os.path.join(path, name, "zarr.json")
        if os.path.lexists(here) and not os.path.isdir(here) and not os.path.isfile(here):
            return os.path.join(path, name)
        if depth > 0 and os.path.isdir(here):
            odd = _irregular_below(here, os.path.join(path, name), None, depth - 1)
            if odd is not None:
                return odd
    return None


def _object_key(array: zarr.Array, row: int, col: int) -> str:
    chunk = array.metadata.encode_chunk_key((row, col))
    return f"{array.path}/{chunk}" if array.path else chunk


def _object_exists(array: zarr.Array, row: int, col: int) -> bool:
    """Whether a chunk object exists in a non-local store (an object store: one HEAD request)."""
    from zarr.core.sync import sync

    return bool(sync(array.store.exists(_object_key(array, row, col))))
