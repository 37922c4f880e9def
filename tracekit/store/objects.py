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
from tracekit.store.dtypes import all_finite, storage_dtype
from tracekit.store.hashing import FILE_PIECE, hasher
from tracekit.store.packs import Located
from tracekit.store.scratch import thread_buffer


class Verified:
    """Places whose bytes matched their hash (an object, or a tensor's range of a pack), with
    whether they are all finite, per open store (thread-safe). Objects are immutable, so once
    checked they need not be read again to be trusted. Keyed by hash and place: one tensor's
    bytes can lie in several packs, each checked on its own."""

    def __init__(self):
        self._done: dict[tuple[bytes, Located], bool] = {}
        self._lock = threading.Lock()

    def get(self, digest: bytes, loc: Located) -> bool | None:
        """The finiteness of the bytes at `loc` once verified against `digest`; None while they are not."""
        with self._lock:
            return self._done.get((digest, loc))

    def add(self, digest: bytes, loc: Located, finite: bool) -> None:
        with self._lock:
            self._done[digest, loc] = finite


def damaged(where: str, what: str) -> StoreError:
    return StoreError(f"damaged store: {where}: {what}")


def no_bytes(where: str) -> StoreError:
    """Reading the bytes of a tensor recorded as summary and hash only (--full did not match it)."""
    return StoreError(f"{where}: its bytes were not kept (recorded as summary and hash only; see --full)")


def scan_object(root: str, digest: bytes, info, buf: np.ndarray | None, loc: Located) -> tuple[str | None, bool]:
    """Read the bytes of tensor `info` whose hash is `digest` once: (what is wrong with them, or None
    when they match; whether every element is finite). `buf`: a reusable read buffer (None: one is
    made); `loc`: where they lie (its own object, or its range of a pack: RankView.locations)."""
    key = loc.label
    dtype = storage_dtype(info.dtype)
    expected = info.stored_nbytes
    if buf is None:
        buf = np.empty(min(FILE_PIECE, max(expected, 1)), dtype=np.uint8)
    piece = len(buf) - len(buf) % dtype.itemsize  # whole elements per piece, for the finiteness check
    finite = True
    try:
        # one piece holds it all: read whole (at a URL one GET, no HEAD), its size checked after
        with io.reader(root, loc.key, whole=expected if expected <= piece else None, base=loc.base,
                       length=loc.length) as reader:
            h = hasher(info.name, info.dtype, info.shape, info.shard)
            pos = 0
            while pos < expected or pos == 0:
                n = min(piece, expected - pos)
                got = reader.readinto(pos, memoryview(buf[:n])) if n else 0
                if pos == 0 and reader.size() != expected:
                    return f"its object {key} has {reader.size()} bytes, the index says {expected}", False
                if got != n:
                    return f"its object {key} is truncated", False
                if n == 0:
                    break
                h.update(memoryview(buf[:n]))
                finite = finite and all_finite(buf[:n].view(dtype), info.dtype)
                pos += n
    except FileNotFoundError:
        return f"its object {key} is missing", False
    except OSError as e:
        return f"its object {key} is unreadable ({e.strerror or e})", False
    if h.digest() != digest:
        return f"bytes do not match their hash (object {key})", False
    return None, finite


def read_object(store, digest: bytes, info, where: str, loc: Located) -> tuple[np.ndarray, bool]:
    """The whole object of `info` (flat, storage dtype; `loc`: where it lies, its own object or its
    range of a pack), its bytes checked against `digest` unless this open store verified them
    already; and whether its elements are all finite."""
    key = loc.label
    dtype = storage_dtype(info.dtype)
    out = np.empty(info.stored_numel, dtype=dtype)
    try:
        with io.reader(store.io_root, loc.key, whole=out.nbytes, base=loc.base, length=loc.length) as r:
            got = r.readinto(0, memoryview(out.view(np.uint8))) if out.nbytes else 0
            if r.size() != out.nbytes:
                raise damaged(where, f"its object {key} has {r.size()} bytes, the index says {out.nbytes}")
            if got != out.nbytes:
                raise damaged(where, f"its object {key} is truncated")
    except FileNotFoundError:
        raise damaged(where, f"its object {key} is missing") from None
    except OSError as err:
        raise damaged(where, f"its object is unreadable ({err.strerror or err})") from None
    finite = store.verified.get(digest, loc)
    if finite is None:
        h = hasher(info.name, info.dtype, info.shape, info.shard)
        h.update(memoryview(out.view(np.uint8)))
        if h.digest() != digest:
            raise damaged(where, f"bytes do not match their hash (object {key})")
        finite = all_finite(out, info.dtype)
        store.verified.add(digest, loc, finite)
    return out, finite


def read_object_span(store, digest: bytes, info, where: str, loc: Located, start: int, stop: int) -> tuple[np.ndarray, bool]:
    """Elements [start, stop) of the object of `info` (flat, storage dtype), its whole bytes
    checked against `digest` first unless this open store verified them already (a part of an
    object is never trusted on its own); and whether all its elements are finite."""
    finite = store.ensure_verified(digest, info, where, loc)
    dtype = storage_dtype(info.dtype)
    out = np.empty(max(0, stop - start), dtype=dtype)
    key = loc.label
    try:
        with io.reader(store.io_root, loc.key, base=loc.base, length=loc.length) as r:
            got = r.readinto(start * dtype.itemsize, memoryview(out.view(np.uint8))) if out.nbytes else 0
    except FileNotFoundError:
        raise damaged(where, f"its object {key} is missing") from None
    except OSError as err:
        raise damaged(where, f"its object is unreadable ({err.strerror or err})") from None
    if got != out.nbytes:
        raise damaged(where, f"its object {key} is truncated")
    return out, finite


# Claimed tensor sizes above this are checked against an object when a reader first plans along
# them (ObjectRows._check_huge_claims).
HUGE_CLAIM = 1 << 30


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
        self.shape = (view._listed_rows(kind), width)
        self.ndim = 2
        # virtual chunks of v1's size: the diff splits its work along them
        self.chunks = (1, max(1, min(width, _format.MAX_CHUNK_BYTES // self.dtype.itemsize)))
        self._starts = np.asarray([t.offset for t in self.tensors], dtype=np.int64)
        self._check_huge_claims()
        # the last sharded tensor each thread assembled: a reader takes a tensor piece by piece
        self._assembled = threading.local()

    def _check_huge_claims(self) -> None:
        """StoreError (damage) when the index claims a tensor of more than HUGE_CLAIM bytes that its
        first object does not hold. Readers plan their work along the claimed sizes (xarray's dask
        graph: a chunk per MAX_CHUNK_BYTES), so a lying claim of 2**40 elements cost tracekit.open
        a graph of half a million chunks, half a minute, before the first read found the lie. Real
        tensors that large are few: one stat each."""
        if not self.shape[0]:
            return
        for t in self.tensors:
            expected = t.stored_nbytes
            if expected <= HUGE_CLAIM or t.shard is not None or not t.keeps_bytes:
                continue
            loc = self.view._locations(self.kind, 0)[self._positions[t.name]]  # never packed: its own object
            key = loc.key
            size = io.size(self.view.store.io_root, key)
            if size != expected:
                where = self._where(0, t.name)
                raise damaged(where, f"its object {key} is missing" if size is None else
                              f"its object {key} has {size} bytes, the index says {expected}")

    def _full(self, row: int, t) -> np.ndarray:
        """A sharded tensor assembled from its pieces (flat, storage dtype); one per thread is kept."""
        cached = getattr(self._assembled, "entry", None)
        if cached is not None and cached[0] == (row, t.name):
            return cached[1]
        self._assembled.entry = None  # at most one assembled tensor per thread, even while building the next
        step = self.view._step_of_row(self.kind, row)
        full = self.view.assemble(self.kind, step, t.name).reshape(-1)
        self._assembled.entry = ((row, t.name), full)
        return full

    def _where(self, row: int, name: str) -> str:
        return self.view.where(self.kind, self.view._step_of_row(self.kind, row), name)

    def prefetch(self, row: int, start: int, stop: int) -> None:
        """Start reading from disk the objects that elements [start, stop) of a row lie in (a hint,
        io.prefetch): a caller about to read the range has them arrive while it compares."""
        locs = self.view._locations(self.kind, row)
        i = max(0, int(np.searchsorted(self._starts, start, side="right")) - 1)
        keys = []
        while i < len(self.tensors) and self.tensors[i].offset < stop:
            t = self.tensors[i]
            if t.keeps_bytes and t.shard is None and t.offset + t.numel > start:
                key = locs[self._positions[t.name]].key
                if key not in keys:  # a pack: hinted once, whole (a row's range reads most of it)
                    keys.append(key)
            i += 1
        io.prefetch(self.view.store.io_root, [(key, 0, None) for key in keys])

    def read_into(self, row: int, start: int, stop: int, out: np.ndarray) -> np.ndarray:
        """Elements [start, stop) of a row into `out` (storage dtype, length stop - start).

        Every object touched is checked against its hash (once per open store) and against the
        row's finiteness flag, so no byte of the store is used unchecked."""
        store = self.view.store
        root = store.io_root
        digests = self.view._row_digests(self.kind, row)
        locs = self.view._locations(self.kind, row)
        item = self.dtype.itemsize
        dest = out.view(np.uint8)
        i = max(0, int(np.searchsorted(self._starts, start, side="right")) - 1)
        s = start
        while s < stop:
            t = self.tensors[i]
            e = min(stop, t.offset + t.numel)
            if e > s and not t.keeps_bytes:
                raise no_bytes(self._where(row, t.name))
            if e > s and t.shard is not None:
                full = self._full(row, t)
                out[s - start : e - start] = full[s - t.offset : e - t.offset]
                s = e
            elif e > s:
                pos = self._positions[t.name]
                digest = digests[pos]
                where = self._where(row, t.name)
                whole = s == t.offset and e == t.offset + t.numel
                loc = locs[pos]
                finite = store.verified.get(digest, loc)
                if finite is None and not whole:  # a piece: check the whole object first (once), then read the piece
                    finite = store.ensure_verified(digest, t, where, loc)
                view = memoryview(dest[(s - start) * item : (e - start) * item])
                key = loc.label
                try:
                    with io.reader(root, loc.key, whole=len(view) if whole else None, base=loc.base,
                                   length=loc.length) as r:
                        got = r.readinto((s - t.offset) * item, view)
                        if finite is None and got == len(view):
                            # the whole tensor was read: check these very bytes, no second read
                            if r.size() != len(view):
                                raise damaged(where, f"its object {key} has the wrong size")
                            h = hasher(t.name, t.dtype, t.shape)
                            h.update(view.cast("B") if view.format != "B" else view)
                            if h.digest() != digest:
                                raise damaged(where, f"bytes do not match their hash (object {key})")
                            finite = all_finite(out[s - start : e - start], t.dtype)
                            store.verified.add(digest, loc, finite)
                except FileNotFoundError:
                    raise damaged(where, f"its object {key} is missing") from None
                except OSError as err:
                    raise damaged(where, f"its object is unreadable ({err.strerror or err})") from None
                if got != len(view):
                    raise damaged(where, f"its object {key} is truncated")
                self.view._check_finite_flag(self.kind, row, pos, finite, where)
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


# Bytes hashed at a time when checking an object: a buffer each thread reuses (a fresh one per
# object costs page faults), small enough that the finiteness pass finds it in the CPU cache.
SCAN_BYTES = 1 << 20


def scan_buffer() -> np.ndarray:
    return thread_buffer("scan", SCAN_BYTES, np.uint8)


class PieceReader:
    """A piece's object read front to back in ranges (bounded memory), its bytes hashed as they
    pass unless this open store verified the object already; finish() then checks the hash and
    the finiteness flag (StoreError: damage). Nothing read is to be trusted before finish()."""

    def __init__(self, kind: str, step: int, piece, finite_from_caller: bool = False):
        """finite_from_caller: the caller counts the NaN/Inf of the values it reads (the diff's
        metrics do, exactly) and passes finish() the answer, saving a pass over the bytes."""
        self.kind, self.piece = kind, piece
        self.count_finite = not finite_from_caller
        pv, info = piece.view, piece.info
        self.store = pv.store
        self.where = pv.where(kind, step, info.name)
        if not info.keeps_bytes:
            raise no_bytes(self.where)
        self.dtype = storage_dtype(info.dtype)
        self.key = piece.loc.label
        self.known = self.store.verified.get(piece.digest, piece.loc)  # finiteness, once verified
        self.hash = None if self.known is not None else hasher(info.name, info.dtype, info.shape, info.shard)
        self.finite = True
        self.pos = 0
        try:
            self.reader = io.reader(self.store.io_root, piece.loc.key, base=piece.loc.base, length=piece.loc.length)
        except FileNotFoundError:
            raise damaged(self.where, f"its object {self.key} is missing") from None
        except OSError as err:
            raise damaged(self.where, f"its object is unreadable ({err.strerror or err})") from None
        expected = piece.numel * self.dtype.itemsize
        if self.reader.size() != expected:
            self.close()
            raise damaged(self.where, f"its object {self.key} has the wrong size (the index says {expected} bytes)")
        self.reader.prefetch()

    def read(self, n: int, out: np.ndarray) -> np.ndarray:
        """The next n elements (storage dtype) into out[:n]."""
        data = out[:n]
        view = memoryview(data.view(np.uint8))
        try:
            got = self.reader.readinto(self.pos * self.dtype.itemsize, view) if n else 0
        except OSError as err:
            raise damaged(self.where, f"its object is unreadable ({err.strerror or err})") from None
        if got != len(view):
            raise damaged(self.where, f"its object {self.key} is truncated")
        if self.hash is not None:
            self.hash.update(view)
            if self.count_finite:
                self.finite = self.finite and all_finite(data, self.piece.info.dtype)
        self.pos += n
        return data

    def finish(self, finite: bool | None = None) -> None:
        """After the last range: StoreError (damage) unless the bytes match their hash and flag.
        finite: whether every element read was finite (required with finite_from_caller)."""
        self.close()
        pv, info = self.piece.view, self.piece.info
        if self.pos != self.piece.numel:
            raise ValueError("a piece is checked only once read whole")
        if self.known is not None:
            finite = self.known  # verified before: what its bytes said then
        else:
            if self.hash.digest() != self.piece.digest:
                raise damaged(self.where, f"bytes do not match their hash (object {self.key})")
            if self.count_finite:
                finite = self.finite
            elif finite is None:
                raise ValueError("finish() needs the finiteness the caller counted")
            finite = bool(finite)
            self.store.verified.add(self.piece.digest, self.piece.loc, finite)
        pv._check_finite_flag(self.kind, self.piece.row, pv.position(self.kind, info.name), finite, self.where)

    def close(self) -> None:
        if self.reader is not None:
            self.reader.close()
            self.reader = None
