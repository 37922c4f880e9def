"""Helpers for users' own test suites.

    from tracekit.testing import assert_stores_close
    assert_stores_close("runs/ref", "runs/cand", rtol=1e-5, atol=1e-6)

`write_store` builds a small store from numpy arrays (or torch tensors), for fixtures.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from tracekit.compare import diff
from tracekit.compare.render import render

__all__ = ["assert_stores_close", "tensor_bytes", "write_store"]


def assert_stores_close(ref, cand, *, max_rows: int = 10, **options) -> None:
    """Raise AssertionError, with the diff's first divergence and worst tensors, unless `cand`
    matches `ref` within tolerance. Takes the keyword arguments of `tracekit.diff`
    (align, rtol, atol, tol, exact, equal_nan, kinds, allow_missing, oracle, ...).
    StoreError/UsageError (unusable input) propagate as they are."""
    report = diff(ref, cand, **options)
    if report.passed:
        return
    raise AssertionError("the stores differ:\n" + render(report, max_rows=max_rows))


def _tensor_data(name: str, value):
    from tracekit.store import TensorData

    if isinstance(value, TensorData):  # given whole, e.g. a rank's piece of a sharded tensor (its Shard)
        return value
    if hasattr(value, "detach"):  # a torch tensor: keep its dtype (bfloat16 stored as bits)
        from tracekit.store.tensors import from_torch

        return from_torch(name, value)
    arr = np.asarray(value)
    return TensorData(name, str(arr.dtype), tuple(arr.shape), arr)


def write_store(path, data: Mapping[int, Mapping[int, Mapping[str, Mapping[str, object]]]], *,
                coords: Mapping[int, dict] | None = None, run: dict | None = None, meta: dict | None = None,
                force: bool = False, format_version: int | None = None, full=(), traces=None) -> str:
    """Write a store from `data[rank][step][kind][tensor name] = array` (or a TensorData, e.g. one
    with a Shard: the rank's piece of a sharded tensor, tracekit/store/shards.py).

    Steps are written in increasing order and each is marked complete (parameters may have a
    step 0, the initial parameters). `coords[rank]` are the rank's coordinates (default: a 1-D
    data-parallel layout over the given ranks), `run` the run facts every rank reports, `meta`
    extra root metadata, `format_version` the store format (default: the current one for a
    folder, see create_store; 1 writes the packed layout of older tracekits), `full` the patterns of
    the tensors whose bytes are kept (tracekit/store/keep.py; empty: all), `traces[rank][step][level]`
    a traced step's events (a list of event dicts; docs/FORMAT.md, "Traces"). Returns the path.
    """
    from tracekit.store import RankWriter, create_store

    path = str(path)
    world = len(data)
    create_store(path, dict(meta or {}), force=force, format_version=format_version)
    for rank in sorted(data):
        c = dict(coords[rank]) if coords and rank in coords else {
            "rank": rank, "local_rank": rank, "world_size": world, "dp_degree": world, "dp_rank": rank,
            "tp_degree": 1, "tp_rank": 0}
        w = RankWriter(path, rank, {"coords": c, "run": dict(run or {})}, full=full)
        traced = (traces or {}).get(rank, {})
        if traced:
            from tracekit.store.traces import TraceWriter

            tw = TraceWriter(w.zarr_group())
        for step in sorted(data[rank]):
            for kind, tensors in data[rank][step].items():
                w.write(step, kind, [_tensor_data(n, v) for n, v in tensors.items()])
            for level, events in traced.get(step, {}).items():
                tw.write_step(level, step, list(events))
            if step > 0:
                w.complete_step(step)
        w.close()
    return path


# Where one recorded tensor's bytes, or an index row's chunk file, lie in a local store, for tests
# that damage them on purpose: the store's own answer, offered here beside the other test helpers.
from tracekit.store.places import index_chunk, tensor_bytes  # noqa: E402,F401
