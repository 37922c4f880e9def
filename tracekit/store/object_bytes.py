"""A store's bytes at a URL (the object-store ByteStore, tracekit/store/bytestore.py): GET, HEAD and
PUT through the Location's zarr store (zarr's ObjectStore or FsspecStore, tracekit/store/location.py).
A PUT replaces an object whole, so no temporary name is needed; a step's objects are put together,
their requests running concurrently.
"""

from __future__ import annotations

import errno
from typing import Iterable


class ObjectBytes:
    """The objects of a store at the URL of `location`."""

    direct_io = False
    atomic_rename = False  # nothing to rename: a PUT is atomic by itself
    listing = True  # by key prefix
    read_hints = False  # reads are ranged GETs of what is compared: nothing to read ahead
    batch_writes = True  # a step's objects go out together (HEADs and PUTs concurrently)

    def __init__(self, location):
        self.location = location

    @property
    def conditional_create(self) -> bool:
        """Whether this client creates an object only if absent (S3's If-None-Match: * through obstore)."""
        try:
            from obstore.store import S3Store
        except ImportError:
            return False
        return isinstance(getattr(self.location._remote(), "store", None), S3Store)

    def exists(self, key: str) -> bool:
        return self.location.exists(key)

    def size(self, key: str) -> int | None:
        return self.location.size(key)

    def reader(self, key: str, whole: int | None = None, ranged: bool = False) -> "_RemoteReader":
        return _RemoteReader(self.location, key, whole, ranged)

    def write_objects(self, items, direct=None) -> int:
        if not items:
            return 0
        return self.location.put_missing([(k, _joined(p)) for k, p in items])

    def prefetch(self, spans: Iterable[tuple[str, int, int | None]]) -> None:
        pass

    def direct_writes(self) -> None:
        return None


def _obstore_of(zarr_store):
    """The obstore store under zarr's ObjectStore (obstore's S3 client), or None (FsspecStore)."""
    try:
        from obstore.store import S3Store
    except ImportError:
        return None
    inner = getattr(zarr_store, "store", None)
    return inner if isinstance(inner, S3Store) else None


def _joined(parts):
    """One bytes-like object of the parts (no copy for a single part)."""
    parts = list(parts)
    if len(parts) == 1:
        return parts[0]
    return b"".join(parts)


class _RemoteReader:
    """An object at a URL store: its size (one HEAD, when asked), then ranged GETs through the
    location's zarr store; or, for a caller reading it whole, one plain GET that gives both; or,
    `ranged` (a caller that reads a range of it at once, a tensor in a pack) on obstore's S3 client,
    one ranged GET that gives both (its answer carries the object's size)."""

    def __init__(self, location, key: str, whole: int | None = None, ranged: bool = False):
        from zarr.core.sync import sync

        self.key = key
        self._store = location._remote()
        self._sync = sync
        self._size: int | None = None
        self._whole = whole
        # obstore's S3 store under zarr's, where a ranged caller's first read is one ranged GET; else None
        self._obstore = _obstore_of(self._store) if ranged else None
        if whole is None and self._obstore is None:
            self.size()  # missing: FileNotFoundError now, as a local open would

    def _call(self, coro):
        try:
            return self._sync(coro)
        except FileNotFoundError:
            raise
        except Exception as e:  # a refused or failed request: one line for the caller
            raise OSError(errno.EIO, f"{e.__class__.__name__}: {e}") from None

    def size(self) -> int:
        if self._size is None:
            self._size = int(self._call(self._store.getsize(self.key)))
        return self._size

    def readinto(self, offset: int, view: memoryview) -> int:
        from zarr.abc.store import RangeByteRequest
        from zarr.core.buffer import default_buffer_prototype

        dest = view.cast("B") if view.format != "B" else view
        if self._size is None and offset == 0 and self._whole is not None and len(dest) >= self._whole:
            buf = self._call(self._store.get(self.key, default_buffer_prototype()))  # the whole object
            if buf is None:
                raise FileNotFoundError(self.key)
            data = buf.as_numpy_array()
            self._size = len(data)  # a longer object than expected shows in size(), not here
            n = min(len(dest), len(data))
            dest[:n] = data[:n]
            return n
        if self._size is None and self._obstore is not None and len(dest):
            got = self._ranged_get(offset, len(dest))
            if got is not None:
                data, self._size = got
                dest[: len(data)] = data
                return len(data)
        want = min(len(dest), max(0, self.size() - offset))
        if want == 0:
            return 0
        buf = self._call(self._store.get(self.key, default_buffer_prototype(), RangeByteRequest(offset, offset + want)))
        if buf is None:
            raise FileNotFoundError(self.key)
        data = buf.as_numpy_array()
        dest[: len(data)] = data
        return len(data)

    def _ranged_get(self, offset: int, length: int):
        """(the bytes from offset, at most length of them; the object's size) in one GET, or None where
        that GET cannot answer (a range past the object's end): the caller then asks its size first.
        Missing: FileNotFoundError."""
        import obstore

        async def get():
            result = await obstore.get_async(self._obstore, self.key, options={"range": (offset, offset + length)})
            return memoryview(await result.bytes_async()), int(result.meta["size"])

        try:
            return self._sync(get())
        except FileNotFoundError:
            raise
        except Exception:  # 416 (the range starts past the end: damage) and the like: the HEAD path says what
            return None

    def prefetch(self, offset: int = 0, length: int | None = None) -> None:
        pass  # ranged GETs of what is read: nothing to read ahead

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass
