"""The index rows formats 2 to 4 write beside each (rank, kind): per row, each tensor's content
hash, its finiteness flag and (since summaries exist) its summary, sealed to its rank, kind and
step from format 4 on; and where each tensor's bytes lie (its object or its range of a pack,
format 3). RankView (store/reader.py) reads them through this mixin; nothing else in RankView
knows their arrays, widths, seals or packs.
"""

from __future__ import annotations

import numpy as np
import zarr

from tracekit.errors import StoreError
from tracekit.store.chunks import chunk_cols, first_missing_chunk, listed_chunks
from tracekit.store.format import FINITE_ARRAY, HASH_ARRAY, SUMMARY_ARRAY
from tracekit.store.hashing import HASH_BYTES
from tracekit.store.packs import PACKS, Located, PackSpec, locations
from tracekit.store.rows import MissingChunk, RowFiles
from tracekit.store.summaries import N_FIELDS, fields_of, row_identity, row_width, unseal


class HashedIndex:
    """RankView's reading of its hashed index rows (the caches are RankView's: _index_arrays,
    _row_files_of, _index_cache, _pack_specs, _checked_rows)."""

    def _index_array(self, kind: str, name: str) -> zarr.Array:
        with self._lock:
            arr = self._index_arrays.get((kind, name))
        if arr is None:
            if self._member(kind, name) is None:
                raise StoreError(f"{self.store.path}: rank {self.rank} {kind}: no {name!r} index array (damaged store?)")
            arr = self._checked_array(kind, name, [])
            with self._lock:
                self._index_arrays[(kind, name)] = arr
        return arr

    def _row_files(self, kind: str, name: str) -> RowFiles | None:
        """How to read the index array's rows as files (None: through zarr)."""
        with self._lock:
            if (kind, name) in self._row_files_of:
                return self._row_files_of[kind, name]
        files = RowFiles.of(self._index_array(kind, name))
        with self._lock:
            self._row_files_of[kind, name] = files
        return files

    def _index_row(self, kind: str, name: str, row: int, width: int) -> np.ndarray:
        """One row of an index array; in format 4 only once the row's seal holds (row_summaries):
        a hash or finiteness row is never used from another rank, kind or step."""
        values = self._raw_index_row(kind, name, row, width)
        if self.sealed and name in (HASH_ARRAY, FINITE_ARRAY):
            self._row_summaries(kind, row)
        return values

    @property
    def sealed(self) -> bool:
        """Whether index rows are sealed to their rank, kind and step (format 4, summaries.row_identity)."""
        return self.store.format.sealed_rows

    def _row_bound(self, kind: str, row: int, step: int | None = None, rank: int | None = None) -> bytes:
        """What a format-4 row's seal covers besides its summaries, for this rank (or `rank`) and the
        step the kind's step list gives the row (or `step`): verify asks for other places to say
        where a misplaced row came from."""
        n = len(self.tensors(kind))
        step = self._step_of_row(kind, row) if step is None else step
        return (row_identity(self.rank if rank is None else rank, kind, -1 if step is None else step)
                + self._raw_index_row(kind, HASH_ARRAY, row, HASH_BYTES * n).tobytes()
                + self._raw_index_row(kind, FINITE_ARRAY, row, n).tobytes())

    def _sealed_as(self, kind: str, row: int, raw: np.ndarray, fields: int) -> str | None:
        """Where a row whose seal fails here was written, among the likely places (this kind's other
        steps, the other ranks at this step, this rank's other kinds): "rank R KIND step S", or None
        (damaged values, or a place further off). Asked only on a failure; a few hashes of one row."""
        step = self._step_of_row(kind, row)
        tail = self._row_bound(kind, row)[len(row_identity(self.rank, kind, -1 if step is None else step)):]
        try:
            ranks, kinds = self.store.ranks, self.kinds
        except StoreError:
            ranks, kinds = [], []
        places = ([(self.rank, kind, s) for s in self._rows(kind) if s != step]
                  + [(r, kind, step) for r in ranks if r != self.rank]
                  + [(self.rank, k, step) for k in kinds if k != kind])
        for r, k, s in places:
            if s is not None and unseal(raw, fields, row_identity(r, k, s) + tail) is not None:
                return f"rank {r} {k} step {s}"
        return None

    def _raw_index_row(self, kind: str, name: str, row: int, width: int) -> np.ndarray:
        key = (kind, name, row)
        with self._lock:
            cached = self._index_cache.get(key)
        if cached is not None:
            return cached
        where = lambda: f"{self.store.path}: rank {self.rank} {kind} step {self._step_of_row(kind, row)}"
        files = self._row_files(kind, name)
        arr = self._index_array(kind, name) if files is None else None
        shape = files.shape if files is not None else arr.shape
        if shape[1] != width or not 0 <= row < shape[0]:
            raise StoreError(f"damaged store: {where()}: the {name} index does not match the tensor index")
        try:
            if files is not None:
                values = files.read(row)
            else:  # not a plain local array (an object store, another codec): through zarr
                listed = self._once(self._chunk_lists, (kind, name), lambda: listed_chunks(arr))
                missing = first_missing_chunk(arr, [row], chunk_cols(0, width, arr.chunks[1]), listed)
                if missing is not None:
                    raise MissingChunk(*missing, arr.metadata.encode_chunk_key(missing))
                values = np.asarray(arr[row])
        except MissingChunk as m:
            raise StoreError(f"damaged store: {where()}: chunk {m.key} of its {name} index is missing") from None
        except Exception as e:
            raise StoreError(f"damaged store: {where()}: unreadable {name} index ({e.__class__.__name__}: {e})") from None
        with self._lock:
            self._index_cache[key] = values
        return values

    def _pack_spec(self, kind: str) -> PackSpec | None:
        """How the kind's small tensors are packed (format 3, store/packs.py); None: not at all."""
        def parse():
            try:
                return PackSpec.from_attrs(dict(self._kind(kind).attrs).get(PACKS))
            except ValueError as e:
                raise StoreError(f"{self.store.path}: rank {self.rank} {kind}: malformed tensor index ({e})") from None
        return self._once(self._pack_specs, kind, parse)

    def _locations(self, kind: str, row: int) -> tuple[Located, ...]:
        """Where each tensor's bytes lie at a row, in index order (format 2 and 3)."""
        key = (kind, PACKS, row)
        with self._lock:
            cached = self._index_cache.get(key)
        if cached is None:
            tensors = self.tensors(kind)
            spec = self._pack_spec(kind)
            previous = self._row_digests(kind, row - 1) if spec is not None and row > 0 else None
            cached = tuple(locations(spec, self._row_digests(kind, row),
                                     [t.stored_nbytes if t.keeps_bytes else None for t in tensors],
                                     [t.shard is not None for t in tensors], previous))
            with self._lock:
                self._index_cache[key] = cached
        return cached

    def _locate(self, kind: str, step: int, name: str) -> Located:
        """Where tensor `name`'s bytes on this rank lie at `step` (format 2 and 3): its object, or
        its range of a pack. What tools that look at files (and tests that damage them) ask."""
        return self._locations(kind, self._row(kind, step))[self.position(kind, name)]

    def _row_digests(self, kind: str, row: int) -> tuple[bytes, ...]:
        """Each tensor's 16-byte content hash at a row, in index order (v2 only). The row's one
        tuple, not a copy: the diff asks once per tensor, and a list per ask made it O(tensors^2)."""
        key = (kind, HASH_ARRAY, row, "split")
        with self._lock:
            cached = self._index_cache.get(key)
        if cached is None:  # asked once per tensor by the diff: split once
            n = len(self.tensors(kind))
            raw = self._index_row(kind, HASH_ARRAY, row, HASH_BYTES * n).tobytes()
            cached = tuple(raw[i * HASH_BYTES : (i + 1) * HASH_BYTES] for i in range(n))
            with self._lock:
                self._index_cache[key] = cached
        return cached

    def has_summaries(self, kind: str) -> bool:
        """Whether `kind` holds per-tensor summaries (format 2 stores written since summaries exist)."""
        if not self.store.format.hashed:
            return False
        return self._member(kind, SUMMARY_ARRAY) is not None

    def _row_summaries(self, kind: str, row: int) -> np.ndarray:
        """Each tensor's summary at a row, in index order: float64 (tensors, N_FIELDS) (store/summaries.py)."""
        def unsealed():
            n = len(self.tensors(kind))
            # older format-2 stores have one field fewer (summaries.LEGACY_FIELDS); any other width is damage
            fields = fields_of(self._index_array(kind, SUMMARY_ARRAY).shape[1], n) or N_FIELDS
            raw = self._raw_index_row(kind, SUMMARY_ARRAY, row, row_width(n, fields))
            values = unseal(raw, fields, self._row_bound(kind, row) if self.sealed else b"")
            if values is None:
                origin = self._sealed_as(kind, row, raw, fields) if self.sealed else None
                raise StoreError(f"damaged store: {self.store.path}: rank {self.rank} {kind} step "
                                 f"{self._step_of_row(kind, row)}: " + (
                                     f"its index row was sealed as {origin}'s: read here it would be another step's "
                                     "or rank's data" if origin else
                                     "its index row does not match its seal (written for another rank, kind or step, "
                                     "or its hash, finite or summary row changed)" if self.sealed else
                                     f"its {SUMMARY_ARRAY} index does not match its checksum"))
            values.flags.writeable = False  # shared by every caller
            return values

        return self._once(self._checked_rows, (kind, SUMMARY_ARRAY, row), unsealed)

    def check_summaries(self, kind: str, step: int) -> None:
        """StoreError (damage) unless the kind's summary row at `step` is intact (nothing without summaries)."""
        if self.has_summaries(kind):
            self._row_summaries(kind, self._row(kind, step))

    def _finite_flags(self, kind: str, row: int) -> np.ndarray:
        def checked():
            flags = self._index_row(kind, FINITE_ARRAY, row, len(self.tensors(kind)))
            if flags.size and int(flags.max()) > 1:
                raise StoreError(f"damaged store: {self.store.path}: rank {self.rank} {kind} step "
                                 f"{self._step_of_row(kind, row)}: its {FINITE_ARRAY} index holds {int(flags.max())}, not 0 or 1")
            return flags

        return self._once(self._checked_rows, (kind, FINITE_ARRAY, row), checked)

    def _check_finite_flag(self, kind: str, row: int, position: int, finite: bool, where: str) -> None:
        """StoreError (damage) unless the index's finiteness flag of tensor `position` at `row`
        says what its verified bytes say: a lying flag could let the diff skip NaNs by hash."""
        flag = bool(self._finite_flags(kind, row)[position])
        if flag != finite:
            raise StoreError(f"damaged store: {where}: its {FINITE_ARRAY} index says "
                             f"{'all finite' if flag else 'not all finite'}, its bytes say otherwise")
