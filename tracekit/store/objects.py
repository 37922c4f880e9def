"""Format v2 reading: a kind's storage array presented as rows of tensors, read from content-addressed objects.

The tensor index keeps v1's addressing (tensor at `offset` of its storage array's row), so every
reader - diff, xarray view, export, replay - reads v2 through the same (row, element range)
calls as v1. Here a range is mapped onto the objects of the tensors it covers, and each object's
bytes are checked against the hash in the index before they are used: once per object and open
store (a verified object is immutable, so it need not be checked twice).
"""

from __future__ import annotations

import threading

import numpy as np

from tracekit.errors import StoreError
from tracekit.store import format as _format, io
from tracekit.store.dtypes import storage_dtype
from tracekit.store.format import object_key
from tracekit.store.hashing import FILE_PIECE, HASH_BYTES, hasher


class Verified:
    """Digests whose objects were read and matched, per open store (thread-safe)."""

    def __init__(self):
        self._done: set[bytes] = set()
        self._lock = threading.Lock()

    def __contains__(self, digest: bytes) -> bool:
        with self._lock:
            return digest in self._done

    def add(self, digest: bytes) -> None:
        with self._lock:
            self._done.add(digest)


def damaged(where: str, what: str) -> StoreError:
    return StoreError(f"damaged store: {where}: {what}")


def object_problem(root: str, digest: bytes, info, buf: np.ndarray | None = None) -> str | None:
    """What is wrong with the object of tensor `info` whose hash is `digest`; None when its bytes match."""
    key = object_key(digest)
    expected = info.numel * storage_dtype(info.dtype).itemsize
    try:
        reader = io.Reader(root, key)
    except FileNotFoundError:
        return f"its object {key} is missing"
    except OSError as e:
        return f"its object {key} is unreadable ({e.strerror or e})"
    with reader:
        actual = io.size(root, key)
        if actual != expected:
            return f"its object {key} has {actual} bytes, the index says {expected}"
        h = hasher(info.name, info.dtype, info.shape)
        if buf is None:
            buf = np.empty(min(FILE_PIECE, max(expected, 1)), dtype=np.uint8)
        pos = 0
        while pos < expected:
            n = min(len(buf), expected - pos)
            if reader.readinto(pos, memoryview(buf[:n])) != n:
                return f"its object {key} is truncated"
            h.update(memoryview(buf[:n]))
            pos += n
    if h.digest() != digest:
        return f"bytes do not match their hash (object {key})"
    return None


def check_object(root: str, digest: bytes, info, where: str) -> None:
    """StoreError (a damaged store, naming `where`) unless the object's bytes match its hash."""
    problem = object_problem(root, digest, info)
    if problem is not None:
        raise damaged(where, problem)


class ObjectRows:
    """One (rank, kind, storage array) of a v2 store, shaped like v1's packed array (row, element).

    Duck-types the parts of a zarr array the readers use (shape, dtype, ndim, chunks, [row, a:b]);
    rows are those of the kind's hash index array (a listed step's row: see RankView.rows)."""

    def __init__(self, view, kind: str, key: str):
        self.view, self.kind, self.key = view, kind, key
        self.tensors = sorted((t for t in view.tensors(kind) if t.array == key), key=lambda t: t.offset)
        self._positions = {t.name: i for i, t in enumerate(view.tensors(kind))}
        self.dtype = storage_dtype(key)
        width = sum(t.numel for t in self.tensors)
        # rows listed in the kind's steps (an unlisted trailing row of a crash is never read);
        # known from metadata already read, so opening a view opens no index array
        self.shape = (view.listed_rows(kind), width)
        self.ndim = 2
        # virtual chunks of v1's size: the diff splits its work along them
        self.chunks = (1, max(1, min(width, _format.MAX_CHUNK_BYTES // self.dtype.itemsize)))
        self._starts = np.asarray([t.offset for t in self.tensors], dtype=np.int64)

    def _where(self, row: int, name: str) -> str:
        step = self.view.step_of_row(self.kind, row)
        return f"{self.view.store.path}: rank {self.view.rank} {self.kind} step {step} tensor {name}"

    def read_into(self, row: int, start: int, stop: int, out: np.ndarray) -> np.ndarray:
        """Elements [start, stop) of a row into `out` (storage dtype, length stop - start)."""
        root = self.view.store.path
        digests = self.view.row_digests(self.kind, row)
        item = self.dtype.itemsize
        dest = out.view(np.uint8)
        i = max(0, int(np.searchsorted(self._starts, start, side="right")) - 1)
        s = start
        while s < stop:
            t = self.tensors[i]
            e = min(stop, t.offset + t.numel)
            if e > s:
                digest = digests[self._positions[t.name]]
                whole = s == t.offset and e == t.offset + t.numel
                store = self.view.store
                if not whole:  # a piece: check the whole object first (once), then read the piece
                    store.ensure_verified(digest, t, self._where(row, t.name))
                view = memoryview(dest[(s - start) * item : (e - start) * item])
                try:
                    with io.Reader(root, object_key(digest)) as r:
                        got = r.readinto((s - t.offset) * item, view)
                        if whole and got == len(view) and digest not in store.verified:
                            # the whole tensor was read: check these very bytes, no second read
                            if io.size(root, object_key(digest)) != len(view):
                                raise damaged(self._where(row, t.name), f"its object {object_key(digest)} has the wrong size")
                            h = hasher(t.name, t.dtype, t.shape)
                            h.update(view.cast("B") if view.format != "B" else view)
                            if h.digest() != digest:
                                raise damaged(self._where(row, t.name), f"bytes do not match their hash (object {object_key(digest)})")
                            store.verified.add(digest)
                except FileNotFoundError:
                    raise damaged(self._where(row, t.name), f"its object {object_key(digest)} is missing") from None
                except OSError as err:
                    raise damaged(self._where(row, t.name), f"its object is unreadable ({err.strerror or err})") from None
                if got != len(view):
                    raise damaged(self._where(row, t.name), f"its object {object_key(digest)} is truncated")
                s = e
            i += 1
        return out

    def __getitem__(self, key):
        rows, cols = key if isinstance(key, tuple) else (key, slice(None))
        c0, c1, step = cols.indices(self.shape[1]) if isinstance(cols, slice) else (cols, cols + 1, 1)
        if step != 1:
            raise IndexError("strided column reads are not supported")
        scalar_row = isinstance(rows, (int, np.integer))
        row_ids = [int(rows)] if scalar_row else list(range(*rows.indices(self.shape[0])))
        out = np.empty((len(row_ids), max(0, c1 - c0)), dtype=self.dtype)
        for k, r in enumerate(row_ids):
            self.read_into(r, c0, c1, out[k])
        if not isinstance(cols, slice):
            out = out[:, 0]
        return out[0] if scalar_row else out
