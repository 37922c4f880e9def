"""One rank's tensor over its steps, read by (steps, region): the store's logical read for lazy
readers (the xarray backend, tracekit/inspect/backend_array.py), which know no rows or chunks.

Each step's region is a read plan (store/planner.py) executed when asked: the saved pieces it
overlaps, or the span of a storage row that holds it. Reads are checked as every reader's are: a
truncated, corrupt or missing chunk (format 1) or an object whose bytes do not match their hash
(formats 2 on) is one StoreError line.
"""

from __future__ import annotations

import numpy as np

from tracekit.store import planner
from tracekit.store.dtypes import storage_dtype


class TensorSteps:
    """Tensor `name` of `kind` on one rank, at the steps the rank completed (`steps`).

    Made at open: the tensor's storage is opened and its size claims checked then (a lying index
    is one StoreError line before anything is read), as tracekit.open always did."""

    def __init__(self, view, kind: str, name: str):
        self.view, self.kind = view, kind
        self.info = view.tensor(kind, name)
        self.dtype: str = self.info.dtype  # logical: float32, bfloat16, ...
        self.shape: tuple[int, ...] = self.info.shape
        self.steps: tuple[int, ...] = tuple(view.steps(kind))
        self._held = frozenset(self.steps)
        view.check_claims(kind, name)

    def holds(self, step: int) -> bool:
        return step in self._held

    def read(self, steps, region: planner.Region | None = None) -> np.ndarray:
        """Region (offset, shape) of the tensor (default: all of it) at each of `steps` (steps this
        rank has), in storage dtype (bfloat16 as its uint16 bits; tracekit.store.dtypes.to_numpy_values
        decodes), shaped (len(steps), *region shape): one read plan per step."""
        size = self.shape if region is None else tuple(region[1])
        out = np.empty((len(steps), *size), dtype=storage_dtype(self.dtype))
        for k, step in enumerate(steps):
            out[k] = planner.execute(self.view, planner.plan_read(self.view, self.kind, step, self.info.name, region))
        return out
