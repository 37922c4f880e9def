"""The summaries of many small tensors of one dtype at once, bit for bit what summarize() gives each.

summarize() costs ~25 us of Python and numpy call overhead per tensor whatever its size, which
made the writer's CPU per step grow with the number of tensors rather than their bytes (a 2000-
tensor model of 8 MB: ~150 ms a step, against ~10 for 4 tensors of the same bytes). Here tensors
of one length are stacked as the rows of one array and reduced along the rows: min and max
(exact), the sum by `np.add.reduce(axis=1)`, which runs numpy's pairwise sum over each row as it
runs it over the row alone, and the sum of squares by one `vecdot`, each row's the BLAS dot
np.dot takes (the same bits; tests/tracekit/store/test_batch_summaries.py holds them to it). A
tensor this cannot vouch for is summarized on its own, as before: one of at least _DOT elements
(its sum of squares is several dots), one alone of its length, a NaN or an Inf, a zero as its min
or max (whose sign two reductions could pick differently), an integer, bool or complex dtype.
"""

from __future__ import annotations

import numpy as np

from tracekit.store.dtypes import to_numpy_values
from tracekit.store.summaries import L2, MAX, MEAN, MIN, N_FIELDS, NAN, NEG_INF, _DOT, _VECDOT, summarize

# Tensors of fewer elements than this are summarized together (the summary of one of them is one dot).
BATCHED = _DOT


def summaries_of(parts: list[np.ndarray], dtype: str) -> np.ndarray:
    """(len(parts), N_FIELDS) float64: the summary of each flat array of `parts`, all of the
    storage dtype of the logical `dtype`."""
    out = np.empty((len(parts), N_FIELDS), dtype=np.float64)
    alone = []
    by_length: dict[int, list[int]] = {}
    for i, p in enumerate(parts):
        by_length.setdefault(p.size, []).append(i)
    for length, members in by_length.items():
        if len(members) < 2 or not 0 < length < _DOT or _VECDOT is None:
            alone += members
            continue
        rows = to_numpy_values(np.concatenate([parts[i] for i in members]), dtype).reshape(len(members), length)
        if rows.dtype.kind != "f":
            alone += members
            continue
        out[members] = _rows(rows)
        odd = out[members, MIN] * out[members, MAX]  # NaN for a NaN or an Inf, 0 for a zero min or max
        alone += [members[j] for j in np.flatnonzero(~np.isfinite(odd) | (odd == 0)).tolist()]
    for i in alone:
        out[i] = summarize(parts[i], dtype)
    return out


def _rows(rows: np.ndarray) -> np.ndarray:
    """The summaries of the rows of a 2-D float array, as summarize() gives them when every
    element is finite (the caller sends the others to summarize())."""
    out = np.zeros((rows.shape[0], N_FIELDS), dtype=np.float64)
    with np.errstate(invalid="ignore", over="ignore"):  # rows with a NaN or an Inf are summarized again
        out[:, MIN] = np.minimum.reduce(rows, axis=1)
        out[:, MAX] = np.maximum.reduce(rows, axis=1)
        v64 = rows if rows.dtype == np.float64 else rows.astype(np.float64)
        out[:, MEAN] = np.add.reduce(v64, axis=1) / rows.shape[1]
        out[:, L2] = np.sqrt(_VECDOT(v64, v64))
    out[:, NAN:NEG_INF + 1] = 0.0
    return out


class RowSummaries:
    """The summaries of a kind's small tensors, row after row: a tensor whose hash is the one it
    had when last summarized keeps that summary (a frozen parameter, its zero delta), the others
    are summarized together, per dtype (summaries_of). Slots are the tensors' places in the kind."""

    def __init__(self):
        self._last: dict[int, tuple[bytes, np.ndarray]] = {}  # slot -> (hash, summary)

    def fill(self, out: np.ndarray, items: list[tuple[int, bytes, np.ndarray, str]]) -> None:
        """out[slot] = the summary of each (slot, hash, flat data in storage dtype, logical dtype)."""
        todo: dict[str, list[tuple[int, bytes, np.ndarray]]] = {}
        for slot, digest, data, dtype in items:
            last = self._last.get(slot)
            if last is not None and last[0] == digest:
                out[slot] = last[1]
            else:
                todo.setdefault(dtype, []).append((slot, digest, data))
        for dtype, group in todo.items():
            found = summaries_of([data for _, _, data in group], dtype)
            out[[slot for slot, _, _ in group]] = found
            for (slot, digest, _), summary in zip(group, found):
                self._last[slot] = (digest, summary)
