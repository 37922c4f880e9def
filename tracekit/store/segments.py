"""Batched reads of many tensors' element ranges: the diff's streaming reads (compare/engine.py).

A consumer names tensors of one (rank, kind, step) and flat element ranges of them (logical:
row-major elements of the tensor); the store decides how they are read, and nothing outside it
sees a row, a chunk or an offset into one:

- read_units(view, kind, names): the named tensors split into units of work, each a list of
  (tensor, start, stop) the store reads together, in storage order (each unit lies in one
  stored chunk: format 1's packed row, or the same widths of a format 2-4 row of objects);
- SegmentReader(view, kind, step, segments): reads a unit's segments of one side. follows()
  says whether one segment's range continues another's in storage, so that a consumer may ask
  for several back to back in one read(); prefetch() hints the disk; close() when done.

Every byte is read through the format's storage rows (store/rows.py RowReader: chunk files read
directly, ranged GETs, or zarr; formats 2-4: objects checked against their hashes and flags).
"""

from __future__ import annotations

import numpy as np

from tracekit.errors import StoreError
from tracekit.store.rows import RowReader


def _storage(view, kind: str, key: str):
    """The storage array `key` of `kind` (opened once per open store), or one StoreError line."""
    try:
        return view._storage_array(kind, key)
    except StoreError:
        raise  # already one line naming the place and the damage
    except Exception as e:
        raise StoreError(f"{view.store.path}: rank {view.rank} {kind}: cannot open array {key!r} "
                         f"({e.__class__.__name__})") from None


def read_units(view, kind: str, names) -> list[list[tuple[str, int, int]]]:
    """The tensors `names` of `kind` (as rank `view` indexes them) split into units of work: each
    unit a list of (tensor, start, stop) element ranges that lie in one stored chunk, in storage
    order; units in the order of the tensors' storage (first seen), then of their chunks."""
    by_key: dict[str, list] = {}
    for name in names:
        info = view.tensor(kind, name)
        by_key.setdefault(info.array, []).append(info)
    out = []
    for key, infos in by_key.items():
        width = _storage(view, kind, key).chunks[1]
        chunks: dict[int, list[tuple[str, int, int]]] = {}
        for t in sorted(infos, key=lambda t: t.offset):
            s, e = t.offset, t.offset + t.numel
            while s < e:
                c = s // width
                stop = min(e, (c + 1) * width)
                chunks.setdefault(c, []).append((t.name, s - t.offset, stop - t.offset))
                s = stop
        out.extend(segs for _, segs in sorted(chunks.items()))
    return out


class SegmentReader:
    """One side's reads of a unit's segments [(tensor, start, stop)] at a step (the tensors as rank
    `view` indexes them); close() when done (a context manager)."""

    def __init__(self, view, kind: str, step: int, segments: list[tuple[str, int, int]]):
        self.view, self.kind, self.step = view, kind, step
        self._infos = [view.tensor(kind, name) for name, _, _ in segments]
        spans: dict[str, tuple[int, int]] = {}  # per storage array, the element range the segments cover
        for info, (_, start, stop) in zip(self._infos, segments):
            lo, hi = info.offset + start, info.offset + stop
            old = spans.get(info.array)
            spans[info.array] = (lo, hi) if old is None else (min(old[0], lo), max(old[1], hi))
        row = view._row(kind, step)
        self._readers: dict[str, RowReader] = {}
        try:
            for key, span in spans.items():
                self._readers[key] = RowReader(view, kind, step, key, span, array=_storage(view, kind, key), row=row)
        except BaseException:
            self.close()
            raise
        self._spans = spans

    def prefetch(self) -> None:
        """Start reading the segments' bytes from disk in the background (a hint: io.prefetch)."""
        for key, r in self._readers.items():
            r.prefetch(*self._spans[key])

    def follows(self, i: int, end: int, j: int, start: int) -> bool:
        """Whether element `start` of segment j's tensor lies right after element end - 1 of
        segment i's in storage: the two ranges are then one read."""
        a, b = self._infos[i], self._infos[j]
        return a.array == b.array and a.offset + end == b.offset + start

    def dtype(self, j: int) -> np.dtype:
        """The storage dtype segment j is read in (bfloat16 as its uint16 bits)."""
        return self._readers[self._infos[j].array].dtype

    def read(self, j: int, start: int, n: int, out: np.ndarray) -> np.ndarray:
        """n elements in storage dtype from element `start` of segment j's tensor on, continuing
        into the segments that follow it in storage (follows()); into `out` where read directly."""
        info = self._infos[j]
        s = info.offset + start
        return self._readers[info.array].read(s, s + n, out)

    def close(self) -> None:
        for r in self._readers.values():
            r.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
