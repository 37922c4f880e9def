"""Format 6: format 5 with each index row's chunk files at flat keys: `hash/c.<row>.0` (zarr's
default chunk key encoding with the separator "."), where format 5 had `hash/c/<row>/0`.

Why: zarr's "/" keys give every row of every index array a folder of its own, which a local store
must create: 15 folders a rank-step for TorchTitan's five kinds, beside 15 chunk files and ~11
objects, and on this project's test machine creating a folder cost as much as creating a file
(0.02-0.9 ms of kernel CPU each, by the disk's state). Removing a store walks one folder per row too.
The chunk files' bytes are unchanged; zarr and xarray read either encoding from the array's metadata,
and so do tracekit's direct readers (store/rows.py). A version of its own because a format-5 reader
lists an object store's row chunks under `c/`, and would call every row of a format-6 store missing.
"""

from __future__ import annotations

from tracekit.store.formats.v5 import IndexText


class FlatChunks(IndexText):
    version = 6
    chunk_separator = "."
