"""`tracekit.open`: a store as a lazy xarray DataTree (see docs/INSPECT.md for the layout).

It is the xarray backend `engine="tracekit"` (tracekit/inspect/backend.py), opened with dask
chunks when dask is installed (a chunk per rank and step: computations run in parallel, as
dask arrays) and as xarray's own lazy arrays when it is not.
"""

from __future__ import annotations

import importlib.util

from tracekit.store import RunStore, open_store


def dask_installed() -> bool:
    return importlib.util.find_spec("dask") is not None


def open_tree(path, kinds=None, chunks="default"):
    """Open a store as an xarray DataTree, lazily: only metadata is read until values are computed.

    Root node: coords `rank` and, along it, dp_rank, tp_rank, local_rank and mesh positions;
    per-rank `status`, `steps_completed`, `last_step`; the run metadata in attrs.
    One child node per kind (`tree["gradients"]`) whose variables are the tensors under their
    own names, dims (rank, step, <name>_dim0, ...), bfloat16 decoded to float32.
    Steps are the union over ranks; a rank without a step reads NaN there (see coord `recorded`).
    A tensor whose shape differs over ranks is split into `name@rankR` variables over (step, ...).
    chunks: xarray's (None: lazy arrays, no dask); by default a dask chunk per rank and step
    when dask is installed, else None.
    """
    import xarray as xr

    from tracekit.inspect.backend import OpenedStore, TracekitBackendEntrypoint

    if isinstance(chunks, str) and chunks == "default":
        chunks = {} if dask_installed() else None
    store = path if isinstance(path, RunStore) else open_store(path)
    tree = xr.open_datatree(OpenedStore(store), engine=TracekitBackendEntrypoint, chunks=chunks, kinds=kinds)
    for node in tree.subtree:
        # xarray chunks every variable it did not read itself; the coordinates and the root's
        # per-rank facts were read with the metadata, and selecting by them (ds.tp_rank == 1) needs values
        for name, var in node.variables.items():
            if name in node.coords or node.is_root:
                var.load()
    return tree
