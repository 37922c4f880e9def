"""A tensor variable of `tracekit.open` as a lazy xarray BackendArray: (rank, step, *tensor dims).

Nothing is read until xarray indexes it; an index reads, per rank, only the requested steps and
the box of the tensor that holds the selection, each a read plan the store executes
(tracekit/store/spans.TensorSteps, store/planner.py: no rows, chunks or pieces here). Stored bits are decoded as they are
read (bfloat16 and float8 widen exactly to float32: the array's dtype is what it opens as), and a
step a rank did not complete reads NaN.
"""

from __future__ import annotations

import math

import numpy as np
from xarray.backends import BackendArray
from xarray.core import indexing

from tracekit.store.dtypes import storage_dtype, to_numpy_values
from tracekit.store.planner import PREFERRED_READ_BYTES


def value_dtype(logical: str) -> np.dtype:
    """The numpy dtype a tensor reads as (bit-stored dtypes widen to float32)."""
    sdt = storage_dtype(logical)
    return np.dtype(np.float32) if logical != sdt.name else sdt


def _opens_as(logical: str, holes: bool) -> np.dtype:
    """A rank's dtype for the variable: holes (steps it lacks) read NaN, so an integer becomes float."""
    dtype = value_dtype(logical)
    return np.result_type(dtype, np.float32) if holes else dtype


class TensorArray(BackendArray):
    """One tensor over ranks and steps. `sources`: per rank, its TensorSteps (None: the rank lacks
    the tensor: all NaN); `steps`: the variable's steps (the union over ranks). With `per_rank`,
    one source and no rank axis: (step, *dims) (a tensor whose shape differs over ranks)."""

    def __init__(self, sources: list, steps: list[int], shape: tuple[int, ...], logical: str, per_rank: bool = False):
        self.sources, self.steps, self.tensor_shape, self.per_rank = sources, list(steps), tuple(shape), per_rank
        dtypes = [_opens_as(src.dtype if src is not None else logical,
                            bool(self.steps) and (src is None or not all(src.holds(s) for s in self.steps)))
                  for src in sources]
        self.dtype = np.result_type(*dtypes)
        lead = (len(self.steps),) if per_rank else (len(sources), len(self.steps))
        self.shape = (*lead, *self.tensor_shape)

    def preferred_chunks(self, dims: tuple[str, ...]) -> dict[str, int]:
        """A dask chunk per (rank, step), the tensor split along its first dim beyond the store's
        PREFERRED_READ_BYTES (store/planner.py: a dask chunk is then one read)."""
        out = {d: 1 for d in dims[: len(self.shape) - len(self.tensor_shape)]}
        if self.tensor_shape:
            row = math.prod(self.tensor_shape[1:]) * self.dtype.itemsize
            out[dims[len(self.shape) - len(self.tensor_shape)]] = max(1, PREFERRED_READ_BYTES // max(1, row))
        return out

    def __getitem__(self, key: indexing.ExplicitIndexer) -> np.ndarray:
        return indexing.explicit_indexing_adapter(key, self.shape, indexing.IndexingSupport.OUTER, self._read)

    def _read(self, key: tuple) -> np.ndarray:
        if self.per_rank:
            key = (0, *key)
        shape = (len(self.sources), *self.shape[-1 - len(self.tensor_shape):])
        picks = [np.arange(n)[k] for k, n in zip(key, shape)]  # each axis: an int or 1-D positions
        scalar = [np.ndim(p) == 0 for p in picks]
        picks = [np.atleast_1d(p) for p in picks]
        out = np.full([len(p) for p in picks], np.nan if self.dtype.kind in "fc" else 0, dtype=self.dtype)
        if out.size:
            tensor_picks = picks[2:]
            # the box holding the selection: one region read per rank and step (store/planner.py)
            lo = tuple(int(p.min()) for p in tensor_picks)
            box = (lo, tuple(int(p.max()) + 1 - o for p, o in zip(tensor_picks, lo)))
            inner = np.ix_(*(p - o for p, o in zip(tensor_picks, lo)))
            for i, r in enumerate(picks[0]):
                src = self.sources[r]
                if src is None:
                    continue
                wanted = [self.steps[j] for j in picks[1]]
                have = [k for k, s in enumerate(wanted) if src.holds(s)]
                if not have:
                    continue
                bits = src.read([wanted[k] for k in have], box)
                values = to_numpy_values(bits, src.dtype)
                out[i, have] = values[(slice(None), *inner)] if tensor_picks else values
        return out[tuple(0 if s else slice(None) for s in scalar)]
