"""Interactive inspection with xarray: `open` a store, `open_diff` two of them.

Importing this package is cheap: xarray and dask are imported only when a function is called.
The xarray backend (`engine="tracekit"`) is tracekit.inspect.backend.
"""

from __future__ import annotations


def open(path, kinds=None, chunks="default"):  # noqa: A001 - `tracekit.open` mirrors xarray.open_dataset & co.
    """A store as a lazy xarray DataTree: one node per kind, one variable per tensor; dask-backed
    when dask is installed (`chunks`: xarray's, None for no dask).

    It is xarray's engine="tracekit". See :func:`tracekit.inspect.opener.open_tree` and docs/INSPECT.md.
    """
    from tracekit.inspect.opener import open_tree

    return open_tree(path, kinds=kinds, chunks=chunks)


def open_diff(ref, cand, **diff_kwargs):
    """The per-(rank, step, tensor) metrics of `tracekit diff REF CAND` as an xarray Dataset, plus
    lazy elementwise errors; `ds.tracekit` answers the common questions.

    See :func:`tracekit.inspect.diffview.open_diff` and docs/INSPECT.md.
    """
    from tracekit.inspect.diffview import open_diff as _open_diff

    return _open_diff(ref, cand, **diff_kwargs)


__all__ = ["open", "open_diff"]
