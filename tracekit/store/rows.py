"""Reading element ranges of a kind's rows fast, with the checks zarr does not make.

Format v2 rows are read from their content-addressed objects (tracekit/store/objects.py, hash
checked); format v1 rows from the packed arrays' chunk files, as follows.

Two things zarr does not do for us here:
- It returns the fill value for a chunk file that does not exist, so a deleted chunk would read as
  zeros and pass for a tolerance violation. Stores are written with every chunk present, so a
  missing chunk file of a listed row is reported as unreadable data.
- Each zarr read allocates fresh buffers for a whole chunk (up to 64 MiB), then copies out the
  slice. For the store's own layout - a local store, uncompressed little-endian chunks
  (docs/FORMAT.md) - a range is instead read straight from the chunk file (pread) into a small
  buffer the worker thread reuses, and compared while it is still in the CPU cache: the diff then
  moves each byte from the page cache about once, like a plain read. On an object store (s3://)
  the same range is one ranged GET of the chunk object through the zarr store, so a worker only
  ever fetches the bytes it compares. Anything else (another codec) goes through zarr.
"""

from __future__ import annotations

import os
import sys

import numpy as np

from tracekit.errors import StoreError
from tracekit.store import io
from tracekit.store.chunks import chunk_cols, chunk_key, default_key, first_missing_chunk
from tracekit.store.objects import ObjectRows


def _where(view, kind: str, step: int) -> str:
    return f"{view.store.path}: rank {view.rank} {kind} step {step}"


def _plain(arr) -> bool:
    """Whether the array's chunks are raw little-endian elements under default keys (docs/FORMAT.md)."""
    try:
        codecs = arr.metadata.codecs
        plain = (len(codecs) == 1 and type(codecs[0]).__name__ == "BytesCodec"
                 and getattr(getattr(codecs[0], "endian", None), "value", sys.byteorder) == sys.byteorder
                 and type(arr.metadata.chunk_key_encoding).__name__ == "DefaultChunkKeyEncoding")
    except AttributeError:
        return False
    return plain


def _direct_folder(arr) -> str | None:
    """The array's folder when its chunks are local files readable as raw bytes, else None."""
    root = getattr(arr.store_path.store, "root", None)
    if root is None or not hasattr(os, "preadv") or not _plain(arr):
        return None
    return os.path.join(os.fspath(root), arr.store_path.path)


class MissingChunk(Exception):
    """A chunk file of a row is absent (or no regular file: a FIFO, a folder): (row, col, its key
    within the array's folder, as `c/<row>/<col>` or format 6's `c.<row>.<col>`)."""

    @property
    def key(self) -> str:
        return self.args[2]


class RowFiles:
    """The rows of a small plain local array (an index array) read straight from its chunk files,
    with everything but the row worked out once per array: a diff reads one row of each of three
    index arrays per (rank, kind, step), ~20,000 in a 64-rank store, and the per-read work
    (paths, zarr's metadata properties, a stat for the missing-chunk check) cost more than the
    reads. of() gives None where this does not apply (not plain and local: read through zarr)."""

    __slots__ = ("folder", "shape", "width", "dtype", "sep", "chunk_bytes")

    def __init__(self, folder: str, shape: tuple[int, int], width: int, dtype: np.dtype, sep: str):
        self.folder, self.shape, self.width, self.dtype, self.sep = folder, shape, width, dtype, sep
        self.chunk_bytes = width * dtype.itemsize

    @classmethod
    def of(cls, arr) -> "RowFiles | None":
        folder = _direct_folder(arr)
        if folder is None or len(arr.shape) != 2:
            return None
        sep = getattr(arr.metadata.chunk_key_encoding, "separator", None)
        if sep is None or arr.metadata.encode_chunk_key((0, 0)) != default_key(sep, 0, 0):  # not the keys built here
            return None
        return cls(folder, tuple(arr.shape), arr.chunks[1], np.dtype(arr.dtype), sep)

    def read(self, row: int) -> np.ndarray:
        """The whole row. MissingChunk (row, col) for an absent chunk file; StoreError for one of
        the wrong size; OSError as it comes."""
        out = np.empty(self.shape[1], dtype=self.dtype)
        raw = memoryview(out).cast("B")
        sep, item = self.sep, self.dtype.itemsize
        for c in chunk_cols(0, self.shape[1], self.width):
            key = default_key(sep, row, c)
            path = f"{self.folder}/{key}"  # (POSIX only: _direct_folder needs preadv)
            try:
                fd, st = io.open_regular(path)
            except (FileNotFoundError, io.NotRegular):  # (not a regular file: as exists() says of it)
                raise MissingChunk(row, c, key) from None
            try:
                if st.st_size != self.chunk_bytes:  # chunks are written whole (the last one zero-padded)
                    raise StoreError(f"chunk file {key} holds {st.st_size} bytes, not {self.chunk_bytes}")
                start = c * self.width
                n = min(self.width, self.shape[1] - start)
                if os.preadv(fd, [raw[start * item:(start + n) * item]], 0) != n * item:
                    raise StoreError(f"chunk file c/{row}/{c} is truncated")
            finally:
                os.close(fd)
        return out


class RowReader:
    """Element ranges of one row (rank, kind, step, storage array); close() when done."""

    def __init__(self, view, kind: str, step: int, key: str, span: tuple[int, int] | None = None,
                 array=None, row: int | None = None):
        """view: the rank's RankView. span: the element range that will be read, so the zarr path
        reads it once, not per piece. array/row: the opened array and the step's row, when the
        caller already has them."""
        self.view, self.kind, self.step = view, kind, step
        self.span = span
        self._cached: tuple[int, np.ndarray] | None = None
        self.arr = array if array is not None else view._storage_array(kind, key)
        self.row = row if row is not None else view._step_rows(kind)[step]
        self.width = self.arr.chunks[1]
        self.dtype = np.dtype(self.arr.dtype)
        self.objects = isinstance(self.arr, ObjectRows)
        self.folder = None if self.objects else _direct_folder(self.arr)
        # an object store: ranged GETs of chunk objects (the bytes compared, nothing more)
        self.ranged = (not self.objects and self.folder is None
                       and getattr(self.arr.store_path.store, "root", None) is None and _plain(self.arr))
        self._fds: dict[int, int] = {}

    def _key(self, c: int) -> str:
        """The chunk's key relative to the store root (its file path below the store folder)."""
        return chunk_key(self.arr, self.row, c)

    def _path(self, c: int) -> str:
        return os.path.join(self.folder, self.arr.metadata.encode_chunk_key((self.row, c)))

    def _missing(self, c: int) -> StoreError:
        return StoreError(f"{_where(self.view, self.kind, self.step)}: chunk file {self._key(c)} is missing (unreadable data)")

    def _unreadable(self, path: str, what: str) -> StoreError:
        rel = os.path.relpath(path, self.view.store.path)
        return StoreError(f"{_where(self.view, self.kind, self.step)}: chunk file {rel} {what} (unreadable data)")

    def _fd(self, c: int) -> int:
        fd = self._fds.get(c)
        if fd is None:
            path = self._path(c)
            expected = self.width * self.dtype.itemsize  # plain chunks: exactly one chunk's elements
            try:
                fd, info = io.open_regular(path)
                if info.st_size != expected:
                    os.close(fd)
                    what = "is truncated" if info.st_size < expected else f"holds {info.st_size} bytes, not {expected}"
                    raise self._unreadable(path, what)
                self._fds[c] = fd
            except FileNotFoundError:
                raise self._missing(c) from None
            except io.NotRegular:
                raise self._unreadable(path, "is not a regular file") from None
            except OSError as e:
                raise StoreError(f"{_where(self.view, self.kind, self.step)}: unreadable chunk file ({e.strerror or e})") from None
        return fd

    def prefetch(self, start: int, stop: int) -> None:
        """Start reading from disk the files that hold elements [start, stop) (a hint: see io.prefetch)."""
        if self.objects:
            self.arr.prefetch(self.row, start, stop)
        elif self.folder is not None:
            for c in range(start // self.width, (max(stop, start + 1) - 1) // self.width + 1):
                try:
                    io.prefetch_fd(self._fd(c))
                except StoreError:
                    return  # the read reports it

    def read(self, start: int, stop: int, out: np.ndarray) -> np.ndarray:
        """Elements [start, stop) in storage dtype, into `out` (length stop - start) when read directly."""
        if self.objects:
            return self.arr.read_into(self.row, start, stop, out)
        if self.ranged:
            return self._read_ranged(start, stop, out)
        if self.folder is None:
            if self.span is None or not (self.span[0] <= start and stop <= self.span[1]):
                return self._read_zarr(start, stop)
            if self._cached is None:
                self._cached = (self.span[0], self._read_zarr(*self.span))
            lo, data = self._cached
            return data[start - lo : stop - lo]
        item = self.dtype.itemsize
        dest = out.view(np.uint8)
        s = start
        while s < stop:
            c = s // self.width
            e = min(stop, (c + 1) * self.width)
            want = (e - s) * item
            view = memoryview(dest[(s - start) * item : (e - start) * item])
            try:
                got = os.preadv(self._fd(c), [view], (s - c * self.width) * item)
            except OSError as err:
                raise StoreError(f"{_where(self.view, self.kind, self.step)}: unreadable chunk file ({err.strerror or err})") from None
            if got != want:
                raise self._truncated(c)
            s = e
        return out

    def _truncated(self, c: int) -> StoreError:
        return StoreError(f"{_where(self.view, self.kind, self.step)}: chunk file {self._key(c)} is truncated (unreadable data)")

    def _read_ranged(self, start: int, stop: int, out: np.ndarray) -> np.ndarray:
        """Elements [start, stop) by ranged GETs of the chunk objects, into `out`."""
        from zarr.abc.store import RangeByteRequest
        from zarr.core.buffer import default_buffer_prototype
        from zarr.core.sync import sync

        store, item = self.arr.store_path.store, self.dtype.itemsize
        dest = out.view(np.uint8)
        s = start
        while s < stop:
            c = s // self.width
            e = min(stop, (c + 1) * self.width)
            lo = (s - c * self.width) * item
            want = (e - s) * item
            try:
                buf = sync(store.get(self._key(c), default_buffer_prototype(), RangeByteRequest(lo, lo + want)))
            except Exception as err:  # a refused or failed request: one line naming the place
                raise StoreError(f"{_where(self.view, self.kind, self.step)}: unreadable chunk object "
                                 f"({err.__class__.__name__}: {err})") from None
            if buf is None:
                raise self._missing(c)
            data = buf.as_numpy_array().view(np.uint8)
            if data.size != want:
                raise self._truncated(c)
            dest[(s - start) * item : (e - start) * item] = data
            s = e
        return out

    def _read_zarr(self, start: int, stop: int) -> np.ndarray:
        missing = first_missing_chunk(self.arr, [self.row], chunk_cols(start, stop, self.width))
        if missing is not None:
            raise self._missing(missing[1])
        try:
            return self.arr[self.row, start:stop]
        except Exception as e:  # a truncated or corrupt chunk: one line, not a zarr traceback
            raise StoreError(f"{_where(self.view, self.kind, self.step)}: unreadable data ({e.__class__.__name__}: {e})") from None

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()
        self._cached = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
