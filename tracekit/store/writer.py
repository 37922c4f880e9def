"""Writing a store: the root once (launcher or rank 0), then each rank its own group only.

zarr 3.1 loses data when two processes create the same node or write chunks of the same array,
so ownership is strict: the root belongs to whoever creates it, `rank_R/` to rank R's writer.
Format v2 keeps each tensor's bytes as one content-addressed object under `objects/` (shared by
all ranks: every writer of a key writes the same bytes, atomically) and per (rank, kind) only
the index rows (hashes, finiteness); format v1 packs each (rank, kind) into one array per storage
dtype, shaped (row, element). docs/FORMAT.md describes both.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import sys
import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Sequence

import numpy as np
import xxhash

if TYPE_CHECKING:  # imported where a store is created or opened: a rank that only imports this module
    import zarr    # (TensorData, is_store) is spared zarr's ~0.6 s import at every torchrun start

from tracekit.errors import StoreError
from tracekit.store import io, nodes
from tracekit.store.chunks import chunk_key
from tracekit.store.dtypes import all_finite, storage_dtype
from tracekit.store.format import (FINITE_ARRAY, FORMAT_VERSION, HASH_ARRAY, MAX_CHUNK_BYTES, OBJECTS_DIR, ROOT_KEY,
                                   SUMMARY_ARRAY, object_key, rank_group_name)
from tracekit.store.formats import READERS
from tracekit.store.batch_summaries import BATCHED, RowSummaries
from tracekit.store.hashing import ALGORITHM, HASH_BYTES, identity
from tracekit.store.keep import keeps_bytes, parse_full
from tracekit.store.location import resolve
from tracekit.store.local_root import OBJECTS_NOTE, create_local_store, new_root_meta, now_iso
from tracekit.store.meta import STEPS, KindMeta, TensorInfo, index_of
from tracekit.store.nodemeta import NodeMeta
from tracekit.store.object_queue import queue_for
from tracekit.store.ownership import LOCK_ENTRIES
from tracekit.store.packs import PackSpec, groups, pack_key
from tracekit.store.shards import Shard, full_shape
from tracekit.store.summaries import INF, N_FIELDS, NAN, DigestCache, row_identity, row_width, seal
from tracekit.store.summaries import finite as summary_finite
from tracekit.store.target import is_store, root_doc as read_root_doc


def _open_group(*args, **kwargs) -> "zarr.Group":
    return io.load_zarr().open_group(*args, **kwargs)


@dataclass(frozen=True)
class TensorData:
    """One tensor to write: its name, logical dtype, shape, and its data in storage dtype."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    data: np.ndarray  # storage dtype (see tracekit.store.dtypes), any shape with prod(shape) elements
    # None: the whole tensor. Else this rank's piece of a sharded tensor and where it sits in the
    # full one (tracekit/store/shards.py); `shape` is then the piece's shape. Format 2 only.
    shard: "Shard | None" = None
    # Set when the rank hashed and summarized the tensor itself and sent no bytes (a tensor whose
    # bytes are not kept, --full): its hash (hashing.digest_of) and summary; `data` is then empty.
    digest: bytes | None = None
    summary: np.ndarray | None = None


def holds_pieces(path, storage_options=None) -> bool:
    """Whether ranks record into this (existing) store only the pieces of sharded tensors they hold:
    format 2, whose readers assemble whole tensors from the pieces. Every rank reads the same root,
    so all decide alike (the gather this replaces was a collective)."""
    raw = resolve(path, storage_options).read_bytes("zarr.json")
    try:
        fmt = READERS.get(int(json.loads(raw)["attributes"][ROOT_KEY]["format_version"]))
    except (TypeError, ValueError, KeyError):
        return False
    return fmt is not None and fmt.hashed


@io.compact_metadata
def create_store(path, meta: dict, force: bool = False, storage_options=None, format_version: int | None = None) -> None:
    """Create the root group with its metadata. Refuses to clobber anything not asked for.

    format_version: by default the current one (2), for folders and URLs alike; 1 makes the packed
    layout of older tracekits on purpose (tests, benchmarks)."""
    location = resolve(path, storage_options)
    if format_version is None:
        format_version = FORMAT_VERSION
    fmt = READERS.get(format_version)
    if fmt is None:
        raise StoreError(f"cannot write store format {format_version} at {path}")
    if location.is_local:  # written directly, as zarr writes it (store/local_root.py)
        create_local_store(location.path, meta, force, format_version, objects=fmt.hashed)
        return
    # the job's claim (ownership.ObjectClaim), made just before, neither counts nor goes
    if [k for k in location.keys() if k.split("/", 1)[0] not in LOCK_ENTRIES]:
        if not is_store(location):
            raise StoreError(f"{path} is a non-empty location that is not a tracekit store; refusing to touch it")
        if not force:
            raise StoreError(f"{path} already holds a tracekit store; pass --force to overwrite it")
        location.clear(keep=LOCK_ENTRIES)
    # "a", not "w": "w" deletes everything under the prefix, the job's claim object included (cleared above)
    root = _open_group(location.zarr_store(), mode="a", attributes={ROOT_KEY: new_root_meta(meta, format_version)})
    if fmt.hashed:
        # the object folder declared an empty array, as local_root.objects_doc says why
        io.child_array(root, OBJECTS_DIR, shape=(0,), dtype=np.uint8, chunks=(1,), dimension_names=("object_byte",),
                       attributes={ROOT_KEY: OBJECTS_NOTE})


@io.compact_metadata
def update_root_meta(path, storage_options=None, **fields) -> None:
    """Merge fields into the root metadata (only while no rank writes: before start or after end)."""
    root = _open_group(resolve(path, storage_options).zarr_store(), mode="r+", use_consolidated=False)
    meta = dict(root.attrs[ROOT_KEY])
    meta.update(fields)
    root.attrs[ROOT_KEY] = meta


def _chunk_elements(n: int, itemsize: int) -> int:
    return max(1, min(n, MAX_CHUNK_BYTES // itemsize))


def _write_row_chunks(arr: zarr.Array | nodes.LocalArray, row: int, parts: list[np.ndarray]) -> None:
    """Write row `row` of an uncompressed (1, width)-chunked array straight into its chunk files.

    Through zarr's codec pipeline a row costs ~2.4x the CPU of a plain file write (measured with
    zarr 3.1.6: 222 vs 534 MB/s) and needs the row concatenated first; here each tensor's bytes
    go to disk as they are. The files are exactly what zarr writes for the `bytes` codec: the
    chunk's little-endian elements, the last chunk padded with the fill value (0) to full width.
    """
    if isinstance(arr, nodes.LocalArray):  # made by the writer itself (nodes.py): a little-endian local store's
        root, key = arr.root, arr.chunk_key
    else:
        where = io.array_key(arr)
        if sys.byteorder != "little" or where is None:
            arr[row] = np.concatenate(parts) if len(parts) > 1 else parts[0]
            return
        root, key = where[0], functools.partial(chunk_key, arr)
    width, itemsize = arr.chunks[1], arr.dtype.itemsize
    views = iter([memoryview(p.view(np.uint8)) for p in parts if p.size])
    state = {"pending": next(views, None)}

    def chunk_parts():
        room = width * itemsize
        while room and state["pending"] is not None:
            pending = state["pending"]
            take = pending[:room]
            yield take
            room -= len(take)
            state["pending"] = pending[len(take):] if len(take) < len(pending) else next(views, None)

    for j in range(-(-arr.shape[1] // width)):
        # the last chunk is zero-padded to full width, as zarr writes it
        io.write_parts(root, key(row, j), chunk_parts(), pad_to=width * itemsize)


def _index_entries(tensors: Sequence["TensorData"]) -> tuple[list[TensorInfo], dict[str, int]]:
    """The kind's tensor index: each tensor's place in the row of its storage array (v1: a real
    packed array; v2: the same addressing over the tensor's objects), and each array's width."""
    return index_of((t.name, t.dtype, t.shape) for t in tensors)


def _check_same_tensors(kind: str, index: list[TensorInfo], tensors: Sequence["TensorData"], shards=None) -> None:
    shards = shards or [None] * len(tensors)
    if ([(t.name, t.dtype, full_shape(t.shape, sh), sh) for t, sh in zip(tensors, shards)]
            != [(e.name, e.dtype, e.shape, e.shard) for e in index]):
        raise StoreError(
            f"the {kind} tensors changed between steps (names, dtypes or shapes); "
            "a store keeps one fixed set of tensors per kind"
        )


def _check_next_step(kind: str, steps: list[int], step: int) -> None:
    """Rows go in step order: readers refuse a step list out of order as damage (a swapped list
    would read one step's row as another's), so the writer never makes one."""
    if steps and step <= steps[-1]:
        raise StoreError(f"{kind} of step {step} written after step {steps[-1]}; a kind's steps are written in increasing order")


def _row_array(group, name: str, width: int, dtype, separator: str = "/"):
    """A row array of `group` (a zarr Group or a LocalGroup: nodes.row_array); `separator`: of its chunk keys."""
    return nodes.row_array(group, name, width, _chunk_elements(width, np.dtype(dtype).itemsize), dtype, separator)


class _ObjectKindWriter:
    """Format v2: each tensor's bytes once as a content-addressed object (only the tensors `full`
    keeps; store/keep.py), then one index row per step: hashes, finiteness flags and summaries."""

    def __init__(self, group: zarr.Group | nodes.LocalGroup, kind: str, store_root, full: Sequence[str] = (),
                 packs: PackSpec | None = None, sealed_to: int | None = None, index_text: bool = False,
                 separator: str = "/"):
        """store_root: where tracekit/store/io.py writes objects (a folder, a URL's Location, or their ByteStore);
        packs: how small tensors are packed (format 3, store/packs.py), None: each its own object;
        sealed_to: the rank each row is sealed to (format 4, summaries.row_identity), None: unsealed;
        index_text: the tensor index is written as one JSON text (format 5, meta.encode_index);
        separator: of the index rows' chunk keys ("." in format 6: no folder per row)."""
        self.group = group
        self.separator = separator
        self.index_text = index_text
        self.sealed_to = sealed_to
        self.packs = packs
        self.group_meta = NodeMeta(group)  # the only writer of the kind's metadata from here on
        self.full = tuple(full)
        self.kind = kind
        self.root = io.byte_store(store_root)  # chosen once: local folder or object store
        self.index: list[dict] | None = None
        self.hash_array: zarr.Array | nodes.LocalArray | None = None
        self.finite_array: zarr.Array | nodes.LocalArray | None = None
        self.summary_array: zarr.Array | nodes.LocalArray | None = None
        self.array_meta: dict[str, NodeMeta] = {}
        self.steps: list[int] = []
        self.objects_written = 0  # new objects; the rest were already in the store (dedup)
        self.present: set[str] = set()  # object keys this writer knows are stored (asked once)
        self.direct = self.root.direct_writes()  # large objects around the page cache (io.Direct)
        # a local store's objects go to the disk from a thread while the next tensors are hashed
        self.queue = None if self.root.batch_writes else queue_for(self.root)
        self._digests = DigestCache()  # per tensor: a frozen one is hashed, and its summary reused
        self._small_summaries = RowSummaries()  # the same for the small ones, summarized together

    def _create(self, tensors: Sequence[TensorData], shards) -> None:
        index, _ = index_of((t.name, t.dtype, full_shape(t.shape, sh)) for t, sh in zip(tensors, shards))
        index = [replace(e, shard=sh, keeps_bytes=keeps_bytes(self.full, self.kind, e.name)) for e, sh in zip(index, shards)]
        n = len(index)
        sep = self.separator
        self.hash_array = _row_array(self.group, HASH_ARRAY, HASH_BYTES * n, np.uint8, sep)
        self.finite_array = _row_array(self.group, FINITE_ARRAY, n, np.uint8, sep)
        self.summary_array = _row_array(self.group, SUMMARY_ARRAY, row_width(n), np.float64, sep)
        self.array_meta = {a.path: NodeMeta(a) for a in (self.hash_array, self.finite_array, self.summary_array)}
        self.index = index
        # per tensor, what every step repeats: the identity its hash covers, and its shard's size
        self._idents = [identity(e.name, e.dtype, e.shape, e.shard) for e in index]
        self._numels = [None if e.shard is None else e.shard.numel for e in index]
        # which tensors may go into packs: kept and small (their sizes are fixed for the kind's life)
        self._small = set()
        if self.packs is not None:
            self._small = {i for i, e in enumerate(index) if e.keeps_bytes and e.stored_nbytes < self.packs.below}
        self._sharded = [e.shard is not None for e in index]
        self._previous: list[bytes] | None = None  # the last row's hashes: unchanged tensors are not packed
        self.meta = KindMeta(index, [], ALGORITHM, self.packs)
        self.group_meta.update_attrs(self.meta.to_attrs(self.index_text))

    def append(self, step: int, tensors: Sequence[TensorData], shards=None) -> None:
        """shards: per tensor, None (the whole tensor) or the Shard its data is (tracekit/store/shards.py)."""
        with self.settling():
            row = self._prepare_row(step, tensors, shards, self.steps)
        self._store_rows([row])
        self._raise_failed_write()

    def append_rows(self, rows: Sequence[tuple[int, Sequence[TensorData]]]) -> None:
        """Several steps' rows at once (finalize's derived loss: store/derived_loss.py): each row's
        objects, then one resize of each index array and one listing of the steps, where append
        rewrites four metadata documents per row. The rows are the ones append would write."""
        pending = list(self.steps)
        prepared = []
        with self.settling():
            for step, tensors in rows:
                prepared.append(self.prepare_row(step, tensors, pending))
                pending.append(step)
        self.store_rows(prepared)
        self._raise_failed_write()

    @contextlib.contextmanager
    def settling(self):
        """On an error, wait for the object writes in flight before it goes on: the caller may then
        unmap the bytes they read (a spool entry)."""
        try:
            yield
        except BaseException:
            if self.queue is not None:
                self.queue.settle()
            raise

    def prepare_row(self, step: int, tensors: Sequence[TensorData], steps: list[int]):
        """A row's objects written, after the rows of `steps` (the kind's steps and those prepared
        before it); its index row for store_rows()."""
        return self._prepare_row(step, tensors, [t.shard for t in tensors], steps)

    def store_rows(self, prepared: list) -> None:
        """The index rows of prepared steps (prepare_row), then their steps listed; only those whose
        objects are all stored (a failed object write: the queue's `error`, for the caller to raise)."""
        if prepared:
            self._store_rows(prepared)

    def _raise_failed_write(self) -> None:
        if self.queue is not None and self.queue.error is not None:
            raise self.queue.error

    def _prepare_row(self, step: int, tensors: Sequence[TensorData], shards, steps: list[int]):
        """Write one row's objects (locally: hand them to the queue); return (step, hashes, finiteness,
        sealed summaries, ticket) for its index row."""
        shards = shards or [None] * len(tensors)
        _check_next_step(self.kind, steps, step)
        # the row's tensors as given, compared with the first row's: the full check (full shapes) only when they differ
        given = [(t.name, t.dtype, tuple(t.shape), sh) for t, sh in zip(tensors, shards)]
        if self.index is None:
            self._create(tensors, shards)
            self._given = given
        elif given != self._given:
            _check_same_tensors(self.kind, self.index, tensors, shards)
        n = len(tensors)
        finite = np.empty(n, dtype=np.uint8)
        summaries = np.empty((n, N_FIELDS), dtype=np.float64)
        objects = []  # (key, bytes) of the tensors whose bytes are kept, written together at a URL
        members: dict[int, tuple[bytes, memoryview]] = {}  # position -> (hash, bytes) of a packed tensor
        row_digests: list[bytes] = []
        small: list[tuple[int, bytes, np.ndarray, str]] = []  # (position, hash, data, dtype) of the small tensors
        previous = self._previous
        # locally each object goes to the queue's thread as soon as it is hashed and summarized
        # (object_queue.py), and is written while the next tensors are hashed
        local = not self.root.batch_writes
        # The loop runs for every tensor of every step (600 per step for a 10M-parameter FSDP rank):
        # what does not change between steps is looked up, not recomputed.
        for i, t, sh, ident, numel, entry in zip(range(n), tensors, shards, self._idents, self._numels, self.index):
            if t.digest is not None:  # hashed and summarized by the rank; no bytes came
                if entry.keeps_bytes:
                    raise StoreError(f"{self.kind} tensor {t.name!r}: its bytes are to be kept (--full), but only its hash came")
                row_digests.append(t.digest)
                summaries[i] = t.summary
                finite[i] = summary_finite(t.summary)  # the rank sends no complex tensor this way
                continue
            data = t.data
            if not data.flags.c_contiguous:
                data = np.ascontiguousarray(data)
            data = data.reshape(-1)
            if sh is not None and (tuple(t.shape) != sh.shape or data.size != numel):
                raise StoreError(f"{self.kind} tensor {t.name!r}: its data is not the shard its layout names")
            view = memoryview(data).cast("B")
            if data.size < BATCHED:  # hashed now (as digest_of), summarized with the row's other small ones below
                h = xxhash.xxh3_128(ident)
                h.update(view)
                digest = h.digest()
                small.append((i, digest, data, t.dtype))
            else:
                digest, summaries[i] = self._digests.get(i, ident, data, t.dtype)
                # the summary's NaN/Inf counts are exact but for complex (a magnitude can overflow)
                finite[i] = all_finite(data, t.dtype) if data.dtype.kind == "c" else summary_finite(summaries[i])
            row_digests.append(digest)
            if i in self._small and (previous is None or previous[i] != digest):  # into a pack, after the loop
                members[i] = (digest, view)
            elif entry.keeps_bytes:  # else summary and hash only (--full)
                if local:
                    self._put(object_key(digest), [view])
                else:
                    objects.append((object_key(digest), [view]))
        if small:  # one batched pass per dtype instead of a summary's overhead per tensor
            self._small_summaries.fill(summaries, small)
            at = [i for i, _, data, _ in small if data.dtype.kind != "c"]
            finite[at] = (summaries[at, NAN] == 0) & (summaries[at, INF] == 0)  # summaries.finite, all at once
            for i, _, data, dtype in small:
                if data.dtype.kind == "c":  # (a magnitude can overflow: its counts are not exact)
                    finite[i] = all_finite(data, dtype)
        if members:
            sizes = [len(members[i][1]) if i in members else None for i in range(n)]
            for group in groups(self.packs, sizes, self._sharded):
                self._write_pack([members[i] for i in group], objects, local)
        self._previous = row_digests
        digests = np.frombuffer(b"".join(row_digests), dtype=np.uint8)
        # objects first: an index row never names an object that is not there
        if objects:
            self.objects_written += io.write_objects(self.root, objects, self.present)
        bound = b"" if self.sealed_to is None else row_identity(self.sealed_to, self.kind, step) + digests.tobytes() + finite.tobytes()
        # the ticket: the object writes the row needs (its own, and any earlier one it names)
        return step, digests, finite, seal(summaries, bound), (self.queue.ticket if self.queue is not None else 0)

    def _put(self, key: str, parts: list, in_buffer: bool = False) -> None:
        """A local object written (from the queue's thread) unless this writer knows it is stored."""
        if key in self.present:
            return
        self.queue.put(key, parts, self.direct, in_buffer, self._count)
        self.present.add(key)

    def _count(self, new: int) -> None:
        self.objects_written += new

    def _store_rows(self, prepared: list) -> None:
        """The index rows of prepared steps, after the rows already stored; then list their steps.
        Only the rows whose objects are all stored: none after a failed object write."""
        if self.queue is not None and self.queue.settle() is not None:
            prepared = [p for p in prepared if self.queue.stored(p[4])]  # (tickets grow: a prefix)
            if not prepared:
                return
        first = len(self.steps)
        chunks = []  # (array, row, values)
        for a, arr in enumerate((self.hash_array, self.finite_array, self.summary_array)):
            self.array_meta[arr.path].resize((first + len(prepared), arr.shape[1]))
            chunks += [(arr, first + row, p[1 + a]) for row, p in enumerate(prepared)]
        folder = getattr(self.root, "folder", None)  # a local store's folder (LocalBytes); None for an object store
        if len(prepared) > 1 and folder is not None:  # each row's chunk a new folder: see io.concurrently
            io.concurrently(lambda c: _write_row_chunks(c[0], c[1], [c[2]]), chunks, folder)
        else:
            for arr, row, values in chunks:
                _write_row_chunks(arr, row, [values])
        # The rows count only once they are listed: a crash mid-write leaves unlisted rows behind.
        self.steps.extend(p[0] for p in prepared)
        self.group_meta.update_attrs({STEPS: self.steps})

    def _write_pack(self, members: list[tuple[bytes, memoryview]], objects: list, local: bool) -> None:
        """One pack of this row (store/packs.py), unless it is stored already. Locally its members are
        copied into one page-aligned buffer and written as one file (O_DIRECT where the disk takes it):
        one copy in memory instead of a file created per tensor. At a URL: one PUT among the row's."""
        key = pack_key([d for d, _ in members])
        if key in self.present:
            return
        total = sum(len(v) for _, v in members)
        if not local:
            objects.append((key, [b"".join(v for _, v in members)]))
            return
        buf = self.queue.buffer(total)
        pos = 0
        for _, v in members:
            buf[pos:pos + len(v)] = np.frombuffer(v, dtype=np.uint8)
            pos += len(v)
        self._put(key, [memoryview(buf)], in_buffer=True)


class _KindWriter:
    """Format v1: appends one row per step to the packed arrays of one kind of one rank."""

    def __init__(self, group: zarr.Group | nodes.LocalGroup, kind: str):
        self.group = group
        self.group_meta = NodeMeta(group)  # the only writer of the kind's metadata from here on
        self.kind = kind
        self.index: list[dict] | None = None
        self.arrays: dict[str, zarr.Array | nodes.LocalArray] = {}
        self.array_meta: dict[str, NodeMeta] = {}
        self.steps: list[int] = []

    def _create(self, tensors: Sequence[TensorData]) -> None:
        index, offsets = _index_entries(tensors)
        for key, total in offsets.items():
            self.arrays[key] = _row_array(self.group, key, total, storage_dtype(key))
            self.array_meta[key] = NodeMeta(self.arrays[key])
        self.index = index
        self.meta = KindMeta(index, [])
        self.group_meta.update_attrs(self.meta.to_attrs())

    def append(self, step: int, tensors: Sequence[TensorData]) -> None:
        _check_next_step(self.kind, self.steps, step)
        if self.index is None:
            self._create(tensors)
        else:
            _check_same_tensors(self.kind, self.index, tensors)
        parts: dict[str, list[np.ndarray]] = {k: [] for k in self.arrays}
        for t in tensors:
            if t.digest is not None:
                raise StoreError(f"{self.kind} tensor {t.name!r}: store format 1 keeps every tensor's bytes, but only its hash came")
            parts[t.dtype].append(np.ascontiguousarray(t.data).reshape(-1))
        row = len(self.steps)
        for key, arr in self.arrays.items():
            self.array_meta[key].resize((row + 1, arr.shape[1]))
            _write_row_chunks(arr, row, parts[key])
        # The row counts only once it is listed: a crash mid-write leaves an unlisted row behind.
        self.steps.append(step)
        self.group_meta.update_attrs({STEPS: self.steps})


def _new_kind_writer(rank_group, kind: str, fmt, io_root, full, rank: int):
    """rank_group: a zarr Group, or a LocalGroup (nodes.py), whose kinds are made the same way."""
    return fmt.kind_writer(nodes.child_group(rank_group, kind), kind, io_root, full, rank)


@io.compact_metadata
def add_kind(store_path, rank: int, kind: str, rows: Sequence[tuple[int, Sequence[TensorData]]],
             storage_options=None) -> None:
    """Add a kind to a rank's group after its writer closed it: the launcher's derived loss at
    finalize (store/derived_loss.py). Only safe once no rank writes any more; a kind the rank
    already holds is refused (its rows are the rank's own)."""
    location = resolve(store_path, storage_options)
    root = _open_group(location.zarr_store(), mode="r+", use_consolidated=False)
    fmt = READERS[root.attrs[ROOT_KEY].get("format_version")]
    group = root[rank_group_name(rank)]
    if kind in group:
        raise StoreError(f"{store_path}: rank {rank} already holds {kind}")
    writer = _new_kind_writer(group, kind, fmt, io.byte_store(location), (), rank)  # a few scalars: their bytes always kept
    if not fmt.hashed:
        for step, tensors in rows:
            writer.append(step, tensors)
    else:  # every row's index at once: per-row metadata rewrites made finalize grow with ranks x steps
        writer.append_rows(rows)


@io.compact_metadata
def remove_kind(store_path, rank: int, kind: str, storage_options=None) -> None:
    """Remove a kind's group from a rank's group (finalize: the local losses recorded only to derive
    the loss from, store/derived_loss.py). Its objects stay: packs are shared with other kinds."""
    location = resolve(store_path, storage_options)
    if location.is_local:  # zarr deletes its files one by one, waiting on the disk for each (io.remove_folder)
        folder = os.path.join(location.path, rank_group_name(rank), kind)
        if not os.path.isfile(os.path.join(folder, "zarr.json")):
            raise StoreError(f"{store_path}: rank {rank} holds no {kind}")
        io.remove_folder(folder)
        return
    root = _open_group(location.zarr_store(), mode="r+", use_consolidated=False)
    del root[rank_group_name(rank)][kind]


class RankWriter:
    """Writes rank R's group. Not thread-safe: one writer (thread) per rank."""

    @io.compact_metadata
    def __init__(self, store_path, rank: int, attrs: dict, storage_options=None, run_id: str | None = None,
                 full: Sequence[str] = ()):
        """run_id: the job this rank belongs to; the rank refuses a store that names another (None: adopt it).
        full: patterns of the tensors whose bytes are kept (store/keep.py; empty: all); the others
        keep their summary and hash only (format 2; format 1 keeps every tensor's bytes)."""
        from tracekit.store.ownership import WriterClaim

        location = resolve(store_path, storage_options)
        root_doc = read_root_doc(location)
        if root_doc is None:
            raise StoreError(f"{store_path} is not a tracekit store (create it first)")
        self.path = str(store_path)
        self.rank = int(rank)
        self.location = location
        self.store_path = location.path if location.is_local else str(location)
        self.io_root = io.byte_store(location)  # what store/io.py writes objects under
        # Held while the group is open: the launcher finalizes only once every writer let go (local stores).
        self._claim = WriterClaim(location.path if location.is_local else None)
        try:
            if nodes.direct(location) and root_doc.get("zarr_format") == 3 and root_doc.get("node_type") == "group":
                # the rank's nodes made by the writer itself: no zarr in this process (nodes.py)
                root = nodes.LocalGroup(location.path, "", None)
                root_meta = dict(root_doc["attributes"][ROOT_KEY])
            else:
                root = _open_group(location.zarr_store(), mode="r+", use_consolidated=False)
                root_meta = dict(root.attrs[ROOT_KEY])
            self.run_id = self._check_owner(root_meta, run_id)
            self.format_version = root_meta.get("format_version")
            self.format = READERS.get(self.format_version) if isinstance(self.format_version, int) else None
            if self.format is None:
                raise StoreError(f"{store_path}: cannot append to store format {self.format_version} here")
            self.full = parse_full(full)
            if self.full and not self.format.hashed:
                raise StoreError(f"{store_path}: store format 1 keeps every tensor's bytes; --full needs format 2")
            name = rank_group_name(rank)
            if nodes.holds(root, name):
                raise StoreError(f"{store_path} already holds data of rank {rank}")
            self.group = nodes.child_group(
                root, name, attributes={**attrs, "run_id": self.run_id, "completed_steps": [], "status": "running",
                                        "start_time": now_iso(), **({"full": list(self.full)} if self.full else {})}
            )
            # Every later change of the rank group's attributes goes through here (self.group's own
            # attributes go stale: nothing may write them through zarr any more).
            self.group_meta = NodeMeta(self.group)
        except BaseException:
            self._claim.release()
            raise
        self.kinds: dict[str, _KindWriter | _ObjectKindWriter] = {}
        self.completed: list[int] = []
        self._checked_step: int | None = None

    def zarr_group(self) -> zarr.Group:
        """The rank's group as a zarr Group, for what is written through zarr (traces: store/traces.py).
        Its attributes are stale: they change through self.group_meta only."""
        if isinstance(self.group, nodes.LocalGroup):
            return _open_group(self.location.zarr_store(), mode="r+", path=self.group.path, use_consolidated=False)
        return self.group

    def _check_owner(self, meta: dict, run_id: str | None) -> str | None:
        from tracekit.store.ownership import check_run_id

        check_run_id(self.path, meta, run_id)
        if "end_time" in meta:
            raise StoreError(f"{self.path} was already finalized by its launcher; this rank does not write to it")
        return meta.get("run_id")

    def _still_ours(self, step: int) -> None:
        """Once per step: stop if another job took the store over (its root names another run)."""
        if step == self._checked_step or self.run_id is None:
            return
        for attempt in range(3):
            try:
                meta = json.loads(self.location.read_bytes("zarr.json") or b"")["attributes"][ROOT_KEY]
                break
            except (OSError, ValueError, KeyError, TypeError):
                if attempt == 2:
                    raise StoreError(f"{self.path}: its root metadata is gone or unreadable; this rank stops writing") from None
                time.sleep(0.05)  # a root being rewritten (not atomic through zarr): read it again
        self._check_owner(meta, self.run_id)
        self._checked_step = step

    @io.compact_metadata
    def write(self, step: int, kind: str, tensors: Sequence[TensorData]) -> None:
        if not tensors:
            return
        self._still_ours(step)
        kw = self._kind_writer(kind, tensors)
        if not self.format.hashed:
            kw.append(step, tensors)
        else:
            kw.append(step, tensors, [t.shard for t in tensors])

    @io.compact_metadata
    def write_steps(self, steps: Sequence[tuple[int, dict[str, Sequence[TensorData]], bool]]) -> None:
        """Several steps in order, each (step, {kind: tensors}, complete): what write() of each kind and
        complete_step() of each complete step store, with each kind's metadata documents written once
        for all of them instead of once a step (each rewrite is a new file; the writer process stores
        the steps it held back this way). Each step's objects are written in turn, then each kind's
        index rows at once, then the complete steps listed. A step that fails (its tensors changed, a
        full disk) ends it as it would step by step: the steps before it are stored and listed
        complete, then the error is raised. No object write is in flight once it returns."""
        if not steps:
            return
        self._still_ours(steps[-1][0])
        prepared: dict[str, list] = {}  # kind -> its rows prepared (objects written), to store together
        listed: dict[str, list[int]] = {}  # kind -> its steps, with the prepared ones
        done: list[int] = []
        queue = queue_for(self.io_root) if self.format.hashed and not self.io_root.batch_writes else None
        tickets: dict[int, int] = {}  # step -> the object writes its rows need (object_queue.py)
        try:
            for step, kinds, complete in steps:
                for kind, tensors in kinds.items():
                    if not tensors:
                        continue
                    kw = self._kind_writer(kind, tensors)
                    if not self.format.hashed:  # format 1: one row at a time, its own way
                        kw.append(step, tensors)
                        continue
                    pending = listed.setdefault(kind, list(kw.steps))
                    prepared.setdefault(kind, []).append(kw.prepare_row(step, tensors, pending))
                    pending.append(step)
                if complete:
                    done.append(step)
                tickets[step] = queue.ticket if queue is not None else 0
        finally:  # the rows prepared, a failed step's first kinds included (as a rank dying mid-step leaves them)
            # (no object write in flight once this returns: the caller may unmap the bytes)
            failed = queue is not None and queue.settle() is not None
            for kind, rows in prepared.items():
                self.kinds[kind].store_rows(rows)
            # a step past a failed object write is not complete: some of its rows are not stored
            self._list_complete([s for s in done if not failed or queue.stored(tickets[s])])
            if failed:
                raise queue.error

    def _kind_writer(self, kind: str, tensors: Sequence[TensorData]):
        """The writer of `kind` (made at its first row), once the row's tensors suit the store's format."""
        if not self.format.hashed and any(t.shard is not None for t in tensors):
            raise StoreError(f"{self.path}: store format 1 holds whole tensors only, not the shards of {kind}")
        kw = self.kinds.get(kind)
        if kw is None:
            kw = self.kinds[kind] = _new_kind_writer(self.group, kind, self.format, self.io_root, self.full, self.rank)
        return kw

    @io.compact_metadata
    def complete_step(self, step: int) -> None:
        """Mark a step complete: all of its kinds are written."""
        self._list_complete([step])

    def _list_complete(self, steps: list[int]) -> None:
        """List `steps` (all their kinds written) after the steps already complete: one document written."""
        if steps:
            self.completed.extend(steps)
            self.group_meta.update_attrs({"completed_steps": self.completed})

    @io.compact_metadata
    def update_attrs(self, **fields) -> None:
        self.group_meta.update_attrs(fields)

    @io.compact_metadata
    def close(self, status: str = "finished", cause: str | None = None) -> None:
        try:
            self.group_meta.update_attrs({"status": status, "end_time": now_iso(), **({"cause": cause} if cause else {})})
        finally:
            self._claim.release()

    def leave_open(self) -> None:
        """Let go of the group without closing it: its status stays `running`, for finalize to settle
        from what the launcher knows of the rank (tracekit/store/lost_ranks.py)."""
        self._claim.release()

    def forget_in_child(self) -> None:
        """In a forked child (a DataLoader worker): let the writers lock end with the rank itself."""
        self._claim.forget_in_child()
