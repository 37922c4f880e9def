"""Batched reads of many tensors' element ranges: the diff's streaming reads (compare/engine.py).

A consumer names tensors of one (rank, kind, step) and flat element ranges of them (logical:
row-major elements of the tensor); the store decides how they are read, and nothing outside it
sees a row, a chunk or an offset into one:

- read_units(view, kind, names): the named tensors split into units of work, each a list of
  (tensor, start, stop) the store reads together, in storage order (each unit lies in one
  stored chunk: format 1's packed row, or the same widths of a format 2-4 row of objects);
- SegmentReader(view, kind, step, segments): reads a unit's segments of one side. continues[j]
  says whether segment j's range begins where segment j - 1's ends in storage, so that a
  consumer may ask for several back to back in one read(); prefetch() hints the disk; close().

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
    index = view._kind_index(kind)  # one lookup for the lot (view.tensor() takes a lock per name)
    for name in names:
        info = index.get(name)
        if info is None:
            view.tensor(kind, name)  # raises, naming it
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
        index = view._kind_index(kind)  # one lookup for the lot (view.tensor() takes a lock per name)
        # each segment's tensor's (storage array, offset in its row)
        self._at = at = [(info.array, info.offset) for info in
                         (index.get(name) or view.tensor(kind, name) for name, _, _ in segments)]
        spans: dict[str, tuple[int, int]] = {}  # per storage array, the element range the segments cover
        for (key, offset), (_, start, stop) in zip(at, segments):
            lo, hi = offset + start, offset + stop
            old = spans.get(key)
            spans[key] = (lo, hi) if old is None else (min(old[0], lo), max(old[1], hi))
        row = view._row(kind, step)
        self._readers: dict[str, RowReader] = {}
        try:
            for key, span in spans.items():
                self._readers[key] = RowReader(view, kind, step, key, span, array=_storage(view, kind, key), row=row)
        except BaseException:
            self.close()
            raise
        self._spans = spans
        # whether each segment's range begins right where the one before it ends, in storage
        self.continues = [False] + [ka == kb and oa + prev[2] == ob + seg[1] for (ka, oa), (kb, ob), prev, seg
                                    in zip(at, at[1:], segments, segments[1:])]

    def prefetch(self) -> None:
        """Start reading the segments' bytes from disk in the background (a hint: io.prefetch)."""
        for key, r in self._readers.items():
            r.prefetch(*self._spans[key])

    def dtype(self, j: int) -> np.dtype:
        """The storage dtype segment j is read in (bfloat16 as its uint16 bits)."""
        return self._readers[self._at[j][0]].dtype

    def read(self, j: int, start: int, n: int, out: np.ndarray) -> np.ndarray:
        """n elements in storage dtype from element `start` of segment j's tensor on, continuing
        into the segments after it where they continue it in storage (continues); into `out`
        where read directly."""
        key, offset = self._at[j]
        s = offset + start
        return self._readers[key].read(s, s + n, out)

    def close(self) -> None:
        for r in self._readers.values():
            r.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
