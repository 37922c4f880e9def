"""Reading a store: ranks, their coordinates, completed steps, and tensors by name.

Only rows listed in a kind's `steps` and steps listed in a rank's `completed_steps` are visible,
so a store left behind by a crash reads as exactly the steps that were fully written.

RankView is the logical API: ranks, kinds, steps, tensors and regions of their values, whatever
the format version. A region is read by a plan (store/planner.py: which saved pieces, found from
peers' public API for sharded tensors) that the store's format reader (store/formats/) executes;
what opening refuses is in store/opening.py, the objects' checked reads in store/objects.py.
"""

from __future__ import annotations

import os
import threading
from functools import cached_property

import numpy as np
import zarr

from tracekit.errors import StoreError
from tracekit.store import io, planner
from tracekit.store import objects as _objects  # scan_object looked up when called (tests count its calls)
from tracekit.store.chunks import check_size_claims, irregular_metadata
from tracekit.store.coverage import KEY as COVERAGE_KEY, Coverage
from tracekit.store.dtypes import to_numpy_values
from tracekit.store.format import OBJECTS_DIR, RANK_PREFIX, TRACES_GROUP, rank_group_name
from tracekit.store.formats import reader_for
from tracekit.store.formats.index import HashedIndex
from tracekit.store.hashing import combined
from tracekit.store.kinds import kind_order
from tracekit.store.localmeta import ParsedNodes, local_members
from tracekit.store.location import Location, resolve
from tracekit.store.meta import STEPS, TENSORS, KindMeta, SharedIndexes, TensorInfo
from tracekit.store.objects import ObjectRows, Verified, damaged, no_bytes, read_object, read_object_span, scan_buffer
from tracekit.store.opening import RANK_TYPES, check_types, members, read_root_attrs, step_list
from tracekit.store.packs import Located, PackSpec
from tracekit.store.planner import Piece
from tracekit.store.rows import RowFiles
from tracekit.store.runmeta import RankMeta, RunMeta, RunSetup
from tracekit.store.summaries import combine


class RankView(HashedIndex):
    """One rank's recorded data."""

    def __init__(self, store: "RunStore", rank: int, group: zarr.Group):
        self.store = store
        self.rank = rank
        self.group = group
        self.attrs = dict(group.attrs)
        check_types(self.attrs, RANK_TYPES, f"{store.path}: rank {rank}")
        self._lock = threading.RLock()  # the diff reads one view from several threads
        self._object_rows: dict[tuple[str, str], ObjectRows] = {}
        self._index_cache: dict[tuple[str, str, int], np.ndarray] = {}
        self._index_arrays: dict[tuple[str, str], zarr.Array] = {}
        self._row_files_of: dict[tuple[str, str], RowFiles | None] = {}
        self._packed_arrays: dict[tuple[str, str], zarr.Array] = {}
        self._position_maps: dict[str, dict[str, int]] = {}
        self._layouts: dict[str, tuple] = {}
        self._peers: dict[str, set[int]] = {}
        self._steps: dict[str, list[int]] = {}
        self._row_maps: dict[str, dict[int, int]] = {}
        self.members: dict[tuple[str, str], object] = {}  # (kind, key) -> zarr node, or None: absent
        self._traced = False  # a traces group among its members (set by _kind_groups)
        # The metadata is read once at open and does not change: its step lists are parsed once
        # (a 32-rank diff spent most of its time re-validating them for every piece of every tensor).
        self._row_lists: dict[str, tuple[int, ...]] = {}
        self._own: dict[str, tuple[int, ...]] = {}
        self._indexes: dict[str, dict[str, TensorInfo]] = {}
        self._pack_specs: dict[str, PackSpec | None] = {}
        # index rows checked once (the finiteness flags' values, the summaries' checksum): every
        # tensor read asks for its row's, and a check per ask cost the diff O(tensors) per tensor
        self._checked_rows: dict[tuple[str, str, int], np.ndarray] = {}

    @property
    def coords(self) -> dict:
        coords = self.attrs.get("coords", {"rank": self.rank})
        if not isinstance(coords, dict):
            raise StoreError(f"{self.store.path}: rank {self.rank} has malformed coordinates (damaged metadata)")
        return coords

    @cached_property
    def meta(self) -> RankMeta:
        """The rank's metadata, typed (tracekit/store/runmeta.py): coordinates, run facts, versions, ..."""
        try:
            return RankMeta.from_attrs(self.attrs, self.rank)
        except (TypeError, ValueError) as e:
            raise StoreError(f"{self.store.path}: rank {self.rank} has malformed metadata ({e}; damaged store?)") from None

    @property
    def completed_steps(self) -> list[int]:
        return sorted(step_list(self.attrs.get("completed_steps", []), f"{self.store.path}: rank {self.rank}"))

    @property
    def _final(self) -> dict:
        """What the launcher concluded about this rank at finalization (empty before)."""
        ranks = self.store.meta.get("ranks")
        final = ranks.get(str(self.rank)) if isinstance(ranks, dict) else None
        return final if isinstance(final, dict) else {}

    @property
    def status(self) -> str:
        """finished, failed, terminated, killed, died or running (tracekit/store/status.py): the
        launcher's conclusion once the store is finalized, else what the rank wrote itself."""
        return self._final.get("status") or self.attrs.get("status", "unknown")

    @property
    def cause(self) -> str | None:
        """One line on why the rank did not finish (None when it did, or nothing is known)."""
        return self._final.get("cause") or self.attrs.get("cause")

    @cached_property
    def coverage(self) -> Coverage | None:
        """Which of the training optimizer's parameters the rank recorded, and under which names
        (None: recorded before tracekit stored it, or without an optimizer to compare with)."""
        attrs = self.attrs.get(COVERAGE_KEY)
        if attrs is None:
            return None
        try:
            return Coverage.from_attrs(attrs)
        except (ValueError, TypeError, KeyError) as e:
            raise StoreError(f"{self.store.path}: rank {self.rank} has malformed coverage metadata ({e})") from None

    @property
    def unwritten_steps(self) -> list[int]:
        """Steps the rank completed that its writer process did not store (stopped or killed at
        --flush-timeout; step 0 is the initial parameters): with completed_steps, every step it trained."""
        steps = self._final.get("unwritten_steps", self.attrs.get("unwritten_steps", []))
        return sorted(step_list(steps, f"{self.store.path}: rank {self.rank} unwritten"))

    @property
    def unwritten_cause(self) -> str | None:
        """Why the steps in unwritten_steps were not stored (None when none were lost)."""
        cause = self._final.get("unwritten_cause") or self.attrs.get("unwritten_cause")
        return cause if isinstance(cause, str) and self.unwritten_steps else None

    @property
    def precision(self):
        """The rank's PrecisionContext (tracekit/store/precision.py), or None where none was recorded."""
        from tracekit.store.precision import rank_precision

        return rank_precision(self.attrs, f"{self.store.path}: rank {self.rank}")

    @property
    def exit_code(self) -> int | None:
        """The rank's exit code as its launcher saw it (negative: a signal), where known."""
        return self._final.get("exit_code")

    @cached_property
    def _kind_groups(self) -> dict[str, zarr.Group]:
        groups, below = {}, []
        for name, node in self._listing():
            if "/" in name:
                below.append((name, node))
            elif isinstance(node, zarr.Group) and TENSORS in node.attrs:
                groups[name] = node
            elif name == TRACES_GROUP:
                self._traced = isinstance(node, zarr.Group)
        for name, node in below:  # each kind's arrays, for _member to find without opening them
            kind, _, key = name.partition("/")
            if kind in groups and "/" not in key:
                self.members[(kind, key)] = node
        return groups

    def _listing(self) -> list:
        """The rank group's members and, in the same listing, theirs (a kind's index arrays): zarr
        reads their metadata concurrently, where opening each array alone cost ~1 ms of its sync
        overhead (72 in a 4-rank diff). Where anything below is odd (an irregular file, damaged
        metadata), only the group's own members: each lookup below then meets the problem itself
        and names it under its own kind (_member), the other kinds staying readable. A local store's
        are read here without zarr's I/O thread (localmeta.py), where nothing is odd."""
        fast = local_members(self.group, max_depth=1, parsed=self.store.parsed)
        if fast is not None:
            return fast
        if irregular_metadata(self.group, depth=1) is None:
            try:
                return list(self.group.members(max_depth=1))
            except Exception:
                pass
        return members(self.group, f"{self.store.path}: rank {self.rank}", self.store.parsed)

    @property
    def traced(self) -> bool:
        """Whether the rank holds op traces (its group has a traces group), from the listing made at open."""
        self._kind_groups
        return self._traced

    def trace_steps(self, level: str, listed_only: bool = False) -> list[int]:
        """The rank's completely written traced steps at `level` (store/traces.py); `listed_only`:
        from the step list's metadata alone (damage further down is verify's to find)."""
        from tracekit.store import traces

        return (traces.listed_trace_steps if listed_only else traces.trace_steps)(self.group, level)

    def trace_events(self, level: str, step: int):
        """The events of one traced step, in execution order, typed (store/traces.py read_events)."""
        from tracekit.store.traces import read_events

        return read_events(self.group, level, step)

    def trace_full(self, level: str, step: int, key: str):
        """(bits, dtype, shape) of a tensor the trace kept whole, or None (store/traces.py read_full)."""
        from tracekit.store.traces import read_full

        return read_full(self.group, level, step, key)

    @property
    def kinds(self) -> list[str]:
        return sorted(self._kind_groups, key=lambda k: (kind_order(k), k))

    def _kind(self, kind: str) -> zarr.Group:
        try:
            return self._kind_groups[kind]
        except KeyError:
            raise StoreError(f"rank {self.rank} has no {kind!r} data") from None

    def _once(self, table: dict, key, compute):
        """table[key], computed by compute() the first time (the metadata was read once at open:
        the answer does not change). Thread-safe; a StoreError is raised again on the next ask."""
        with self._lock:
            if key in table:
                return table[key]
        value = compute()
        with self._lock:
            table[key] = value
        return value

    def _kind_index(self, kind: str) -> dict[str, TensorInfo]:
        """{tensor: entry} of one kind, parsed and checked once. Per kind, so that a damaged index
        is reported under its own kind and leaves the other kinds readable."""
        return self._once(self._indexes, kind, lambda: self._parse_index(kind, self._kind(kind)))

    def _parse_index(self, kind: str, g: zarr.Group) -> dict[str, TensorInfo]:
        attrs = dict(g.attrs)
        entries = attrs.get(TENSORS)
        known = self.store.indexes.get(entries, self.store.format.version)
        if known is not None:  # equal to an index parsed and checked before (another rank's, the other store's)
            return known
        try:
            infos = KindMeta.from_attrs(attrs, self.store.format.index_text).tensors
        except (TypeError, KeyError, ValueError, OverflowError) as e:
            raise StoreError(f"{self.store.path}: rank {self.rank} {kind}: malformed tensor index "
                             f"({e.__class__.__name__}: {e})") from None
        bad = self.store.format.check_addresses(infos)  # (format 1: none; later formats: virtual addresses)
        if bad is not None:
            raise StoreError(f"{self.store.path}: rank {self.rank} {kind}: malformed tensor index (the address of "
                             f"{bad.name!r} does not follow from the index; damaged store?)")
        out = {info.name: info for info in infos}
        if len(out) != len(infos):
            raise StoreError(f"{self.store.path}: rank {self.rank} {kind}: malformed tensor index (a name occurs twice)")
        self.store.indexes.put(entries, self.store.format.version, out)
        return out

    def tensors(self, kind: str) -> list[TensorInfo]:
        self._kind(kind)
        return list(self._kind_index(kind).values())

    def position(self, kind: str, name: str) -> int:
        """The tensor's place in its kind's index (the order of the v2 hash and finiteness rows)."""
        try:
            return self._positions(kind)[name]
        except KeyError:
            raise StoreError(f"rank {self.rank} has no {kind} tensor {name!r}") from None

    def _positions(self, kind: str) -> dict[str, int]:
        """{tensor: its place in the kind's index} (read-only: cached)."""
        return self._once(self._position_maps, kind, lambda: {t.name: i for i, t in enumerate(self.tensors(kind))})

    def tensor(self, kind: str, name: str) -> TensorInfo:
        try:
            return self._kind_index(kind)[name]
        except KeyError:
            raise StoreError(f"rank {self.rank} has no {kind} tensor {name!r}") from None

    def steps(self, kind: str) -> list[int]:
        """Steps for which `kind` holds data and the step was completed (step 0: initial parameters).
        A kind holding shards (v2) has a step only once every rank holding one of its pieces has
        it too: a tensor is visible only where it can be assembled whole."""
        with self._lock:
            cached = self._steps.get(kind)
        if cached is not None:
            return list(cached)
        own = self.own_steps(kind)
        peers = self.peers(kind)
        if peers:
            ranks = set(self.store.ranks)
            for p in sorted(peers & ranks):
                try:
                    theirs = set(self.store.rank(p).own_steps(kind))
                except StoreError:  # the peer lacks the kind: reading the tensor names the damage
                    continue
                own = [s for s in own if s in theirs]
        with self._lock:  # the metadata was read once at open: the answer does not change
            self._steps[kind] = own
        return list(own)

    def own_steps(self, kind: str) -> list[int]:
        """The steps this rank wrote completely for `kind`, whatever its peers wrote."""
        return list(self._own_steps(kind))

    def _own_steps(self, kind: str) -> tuple[int, ...]:
        def own() -> tuple[int, ...]:
            done = set(self.completed_steps) | {0}
            return tuple(s for s in self._rows(kind) if s in done)

        return self._once(self._own, kind, own)

    def peers(self, kind: str) -> set[int]:
        """Other ranks holding pieces of this rank's sharded tensors of `kind` (empty: none sharded)."""
        def peers() -> set[int]:
            out = {p for t in self.tensors(kind) if t.shard is not None for p in t.shard.peers}
            out.discard(self.rank)
            return out

        return self._once(self._peers, kind, peers)

    def _rows(self, kind: str) -> tuple[int, ...]:
        """The steps of `kind`'s rows, in row order (read-only: cached)."""
        def parse() -> tuple[int, ...]:
            where = f"{self.store.path}: rank {self.rank} {kind}"
            steps = tuple(step_list(self._kind(kind).attrs.get(STEPS, []), where))
            # rows are appended in step order (the writer refuses any other): a step list out of
            # order, or naming a step twice, would read one step's row as another's
            bad = next((i for i in range(1, len(steps)) if steps[i] <= steps[i - 1]), None)
            if bad is not None:
                raise StoreError(f"damaged store: {where}: its step list is out of order (step {steps[bad]} "
                                 f"after step {steps[bad - 1]}): rows would be read as other steps")
            return steps

        return self._once(self._row_lists, kind, parse)

    def _step_rows(self, kind: str) -> dict[int, int]:
        """{step: row} for the visible steps of `kind`: the one step-to-row mapping of the store
        (read-only: cached)."""
        def step_rows() -> dict[int, int]:
            first: dict[int, int] = {}
            for row, step in enumerate(self._rows(kind)):  # one pass (rows.index per step was O(steps^2))
                first.setdefault(step, row)
            return {s: first[s] for s in self.steps(kind)}

        return self._once(self._row_maps, kind, step_rows)

    def _step_of_row(self, kind: str, row: int) -> int | None:
        rows = self._rows(kind)
        return rows[row] if 0 <= row < len(rows) else None

    def _row(self, kind: str, step: int) -> int:
        row = self._step_rows(kind).get(step)
        if row is None:
            raise StoreError(f"rank {self.rank} has no {kind} data for step {step}")
        return row

    def _storage_array(self, kind: str, key: str):
        """The storage array `key` of a kind, shaped (row, element), as its format reads it
        (store/formats/: a zarr array, or the same view over content-addressed objects)."""
        return self.store.format.storage_array(self, kind, key)

    def check_claims(self, kind: str, name: str | None = None) -> None:
        """StoreError (damage) when the storage tensor `name` (default: every tensor of `kind`) is
        read from does not hold what the index claims (sizes, huge objects): checked once per open
        store, before any read plans along it."""
        infos = self.tensors(kind) if name is None else [self.tensor(kind, name)]
        for key in sorted({info.array for info in infos}):
            self._storage_array(kind, key)

    def _refuse_irregular(self, kind: str, key: str) -> None:
        """StoreError when a member's metadata is not a regular file: zarr, asked anything about the
        member, would block forever opening a FIFO there (or read a device without end)."""
        odd = irregular_metadata(self._kind(kind), [key])
        if odd is not None:
            raise StoreError(f"{self.store.path}: rank {self.rank} {kind}/{key}: {odd} is not a regular file "
                             f"(damaged store?)")

    def _checked_array(self, kind: str, key: str, extents: list[tuple[str, int, int]]) -> zarr.Array:
        """A zarr array of a kind (v1 packed data, v2 index), its size claims checked against the
        files (StoreError if they lie). `extents`: (tensor, offset, numel) the index places in it."""
        where = f"{self.store.path}: rank {self.rank} {kind}/{key}"
        arr = self._member(kind, key)
        if arr is None:
            raise StoreError(f"{where}: unreadable array metadata (no such array)")
        if not isinstance(arr, zarr.Array):
            raise StoreError(f"{where}: is not an array (damaged store?)")
        problem = check_size_claims(arr, len(self._rows(kind)), extents)
        if problem:
            raise StoreError(f"{where}: damaged metadata: it {problem}")
        return arr

    # -- format v2 index: content hashes and finiteness per tensor and row --

    def _member(self, kind: str, key: str):
        """The kind group's member `key` (array or group), or None when it has none: its metadata
        read once per open store (zarr reads it for each lookup, and `key in group` is a lookup:
        ~1-2 ms here, a diff of many ranks did hundreds). StoreError when it is unreadable."""
        with self._lock:
            if (kind, key) in self.members:
                return self.members[(kind, key)]
        self._refuse_irregular(kind, key)  # before zarr opens anything in its place
        try:
            node = self._kind(kind)[key]
        except KeyError:
            node = None
        except StoreError:
            raise
        except Exception as e:  # damaged metadata (bad JSON, bad codec): one line
            raise StoreError(f"{self.store.path}: rank {self.rank} {kind}/{key}: unreadable array metadata "
                             f"({e.__class__.__name__}: {e})") from None
        with self._lock:
            self.members[(kind, key)] = node
        return node

    def empty_completed_steps(self) -> list[int]:
        """Steps listed as completed that no kind holds a row of: damaged metadata (a reader must
        not count them as recorded steps; `tracekit verify` names them)."""
        held: set[int] = set()
        for kind in self.kinds:
            try:
                held.update(self._rows(kind))
            except StoreError:  # a damaged step list is named under its kind; its steps count as held
                return []
        return [s for s in self.completed_steps if s not in held]

    def _check_index_arrays(self, kind: str) -> None:
        """StoreError (damage) unless each of the kind's index arrays (v1: storage arrays) opens and
        holds the rows its step list names: one answer for the kind, not one per row."""
        self.store.format.check_index_arrays(self, kind)

    def _listed_rows(self, kind: str) -> int:
        """Rows of `kind` listed in its steps (written completely; rows are appended in order)."""
        return len(self._rows(kind))

    def digests(self, kind: str, step: int) -> dict[str, bytes] | None:
        """{tensor: content hash} at a step; None for a format v1 store (it has no hashes). A sharded
        tensor's hash is that of its pieces' hashes in peer order (hashing.combined)."""
        if not self.store.format.hashed:
            return None
        out = dict(zip((t.name for t in self.tensors(kind)), self._row_digests(kind, self._row(kind, step))))
        out.update(planner.of_row_pieces(self, "digest", kind, step, lambda ps: combined(d for _, _, _, d, _ in ps)))
        return out

    def _layout(self, kind: str) -> tuple:
        """This rank's sharded tensors of `kind` as (name, peers, shape, dtype): every rank with the
        same layout (all of an FSDP or TP group) gets the same pieces, so answers are kept under it.
        The store's one copy of it (RunStore.layouts), so that its id() names it in cache keys: a
        tuple does not keep its hash, and hashing hundreds of entries per lookup was most of the cost."""
        def layout() -> tuple:
            mine = tuple((t.name, t.shard.peers, tuple(t.shape), t.dtype)
                         for t in self.tensors(kind) if t.shard is not None)
            return self.store.layouts.setdefault(mine, mine)

        return self._once(self._layouts, kind, layout)

    def has_kind(self, kind: str) -> bool:
        return kind in self._kind_groups

    def _own_row(self, kind: str, step: int) -> int | None:
        """The row this rank wrote `kind` at `step` in, whatever its peers wrote (None: none)."""
        return self._rows(kind).index(step) if step in self._own_steps(kind) else None

    def pieces(self, kind: str, step: int, name: str) -> list[Piece]:
        """The pieces of sharded tensor `name` at `step`, each on the rank that wrote it, in peer
        order (StoreError: damage, when a peer's entry does not fit this rank's layout)."""
        return planner.shard_pieces(self, kind, step, name)

    def _object_piece(self, kind: str, step: int, name: str) -> Piece:
        """An unsharded tensor's object (format 2) as a piece covering the whole tensor."""
        info = self.tensor(kind, name)
        row = self._row(kind, step)
        position = self.position(kind, name)
        return Piece(self, row, info, self._row_digests(kind, row)[position], self._locations(kind, row)[position])

    def saved_pieces(self, kind: str, step: int, name: str) -> list[Piece] | None:
        """The saved pieces tensor `name` is read from at `step` (store/planner.py: saved_pieces)."""
        return planner.saved_pieces(self, kind, step, name)

    def summaries(self, kind: str, step: int) -> dict[str, np.ndarray] | None:
        """{tensor: summary (min, max, mean, L2, NaN count, Inf count, -Inf count)} at a step; None where the
        store holds no summaries (format 1, or format 2 before summaries). A sharded tensor's
        summary combines its pieces' (summaries.combine)."""
        if not self.has_summaries(kind):
            return None
        rows = self._row_summaries(kind, self._row(kind, step))
        out = {t.name: rows[i] for i, t in enumerate(self.tensors(kind))}
        for t in self.tensors(kind):
            if t.shard is not None:
                parts = []
                for pv, row, info, _, position in planner.piece_entries(self, kind, step, t):
                    if not pv.has_summaries(kind):
                        return None
                    parts.append((pv._row_summaries(kind, row)[position], info.stored_numel))
                out[t.name] = combine(parts)
        return out

    def read_piece(self, kind: str, step: int, piece: "Piece", span: tuple[int, int] | None = None) -> np.ndarray:
        """One piece's bytes (flat, storage dtype; its elements [start, stop) with `span`),
        checked against its hash (once per open store: the whole piece, before a part of it is
        used) and its finiteness flag, as assemble() checks them."""
        pv, name = piece.view, piece.info.name
        where = pv.where(kind, step, name)
        if not piece.info.keeps_bytes:
            raise no_bytes(where)
        if span is None:
            data, finite = read_object(self.store, piece.digest, piece.info, where, piece.loc)
        else:
            data, finite = read_object_span(self.store, piece.digest, piece.info, where, piece.loc, *span)
        pv._check_finite_flag(kind, piece.row, pv.position(kind, name), finite, where)
        return data

    def assemble(self, kind: str, step: int, name: str) -> np.ndarray:
        """A sharded tensor at a step, whole (storage dtype, its shape): every piece read from the
        rank that wrote it, checked against its hash and finiteness flag; the pieces must tile it."""
        t = self.tensor(kind, name)
        if not t.keeps_bytes:
            raise no_bytes(self.where(kind, step, name))
        if t.shard is None:
            raise StoreError(f"rank {self.rank} {kind} tensor {name!r} is not sharded")
        return self.read_region(kind, step, name)  # the plan checks that the pieces tile it

    @property
    def saves_pieces(self) -> bool:
        """Whether every tensor is saved as checked pieces (saved_pieces never None): a reader may
        then take a tensor piece by piece, each read once and hashed as it passes."""
        return self.store.format.hashed

    def read_region(self, kind: str, step: int, name: str, region=None) -> np.ndarray:
        """Region (offset, shape) of a tensor at a step (default: all of it), storage dtype, its
        shape: the saved pieces overlapping it read and checked (store/planner.py)."""
        return planner.execute(self, planner.plan_read(self, kind, step, name, region))

    def finite(self, kind: str, step: int) -> dict[str, bool] | None:
        """{tensor: True when it holds no NaN/Inf} at a step; None for v1. Index values, checked
        against the bytes whenever those are read (check_finite_flag, check_entry)."""
        if not self.store.format.hashed:
            return None
        names = [t.name for t in self.tensors(kind)]
        flags = self._finite_flags(kind, self._row(kind, step))
        out = {n: bool(f) for n, f in zip(names, flags)}
        # a sharded tensor is finite only if every piece is; each peer's flags taken once per row
        rows: dict[tuple[int, int], list] = {}

        def flags_of(pv: "RankView", row: int) -> list:
            got = rows.get((pv.rank, row))
            if got is None:
                got = rows[pv.rank, row] = pv._finite_flags(kind, row).tolist()
            return got

        out.update(planner.of_row_pieces(self, "finite", kind, step, lambda ps: all(
            flags_of(pv, row)[position] for pv, row, _, _, position in ps)))
        return out

    def where(self, kind: str, step: int, name: str) -> str:
        """How a damage message names one tensor entry."""
        return f"{self.store.path}: rank {self.rank} {kind} step {step} tensor {name}"

    def check_entry(self, kind: str, step: int, name: str) -> None:
        """Check one v2 index entry against the object it names - hash, size and finiteness - reading
        the object only if this open store has not verified it yet. StoreError (damage) otherwise.
        The diff calls this for tensors it decides by equal hashes, so it never trusts an index
        whose bytes it has not seen (docs/FORMAT.md, "Diff by hash")."""
        if not self.store.format.hashed:
            return
        row = self._row(kind, step)
        info = self.tensor(kind, name)
        if not info.keeps_bytes:
            return  # summary and hash only (--full): there is no object to check the hash against
        if info.shard is not None:  # every piece, on the rank that wrote it
            for pv, prow, pinfo, digest, ppos in planner.piece_entries(self, kind, step, info):
                where = pv.where(kind, step, name)
                finite = self.store.ensure_verified(digest, pinfo, where, pv._locations(kind, prow)[ppos])
                pv._check_finite_flag(kind, prow, ppos, finite, where)
            return
        position = self.position(kind, name)
        digest = self._row_digests(kind, row)[position]
        where = self.where(kind, step, name)
        finite = self.store.ensure_verified(digest, info, where, self._locations(kind, row)[position])
        self._check_finite_flag(kind, row, position, finite, where)

    def read_bits(self, kind: str, step: int, name: str, start: int = 0, stop: int | None = None) -> np.ndarray:
        """A tensor's stored data, flat, in storage dtype (bfloat16 as uint16 bits); a slice of it
        with start/stop (store/planner.py: read_flat)."""
        return planner.read_flat(self, kind, step, name, start, stop)

    def read(self, kind: str, step: int, name: str) -> np.ndarray:
        """A tensor as numpy values in its shape (bfloat16 widened exactly to float32)."""
        info = self.tensor(kind, name)
        return to_numpy_values(self.read_region(kind, step, name), info.dtype).reshape(info.shape)

    def read_kind(self, kind: str, step: int) -> dict[str, np.ndarray]:
        """Every tensor of a kind at a step, as numpy values in their shapes (read as read() reads them)."""
        return {info.name: self.read(kind, step, info.name) for info in self.tensors(kind)}


class RunStore:
    """A recorded run, opened read-only."""

    def __init__(self, path, storage_options=None, share_with: "RunStore | None" = None):
        """share_with: another open store (a comparison's other side) whose parsed metadata and
        tensor indexes this one reuses where its own are equal."""
        self.location = resolve(path, storage_options)
        self.indexes = share_with.indexes if share_with is not None else SharedIndexes()
        self.parsed = share_with.parsed if share_with is not None else ParsedNodes()
        # as given for local folders (messages name what the user typed), the URL otherwise
        self.path = os.fspath(path) if self.location.is_local and not isinstance(path, Location) else str(self.location)
        self.meta = read_root_attrs(self.path, self.location)
        self.format = reader_for(self.meta.get("format_version"), self.path)  # store/formats/: picked once
        self.format_version: int = self.format.version
        self.verified = Verified()  # objects whose bytes matched their hash (immutable: checked once)
        self._verify_lock = threading.Lock()
        self._object_locks: dict[tuple, threading.Lock] = {}
        # (what, kind, step, id of a layout) -> the pieces of a row's sharded tensors, or what is made of
        # them (RankView._pieces, _of_row_pieces): asked by every holder of the layout
        self.pieces_cache: dict[tuple, dict] = {}
        self.layouts: dict[tuple, tuple] = {}  # each distinct layout of sharded tensors, once (RankView._layout)
        try:
            self.root = zarr.open_group(self.location.zarr_store(read_only=True), mode="r", use_consolidated=False)
        except Exception as e:
            raise StoreError(f"{self.path}: cannot open as zarr ({e.__class__.__name__}: {e})") from None

    @cached_property
    def _rank_groups(self) -> dict[int, zarr.Group]:
        out = {}
        for name, node in members(self.root, self.path, self.parsed):
            if name.startswith(RANK_PREFIX) and isinstance(node, zarr.Group):
                try:
                    out[int(name[len(RANK_PREFIX) :])] = node
                except ValueError:
                    continue
        return dict(sorted(out.items()))

    @property
    def ranks(self) -> list[int]:
        return list(self._rank_groups)

    def footprint(self) -> tuple[dict[int, int], int, int]:
        """({rank: bytes of its own folder}, bytes shared by all ranks, bytes of the whole store).
        From format 2 on every tensor's bytes live once per content under objects/, shared by all
        ranks: a rank's own folder holds only its indexes, so its bytes are small beside the store's."""
        sizes, total = self.location.sizes_under([*(rank_group_name(r) for r in self.ranks), OBJECTS_DIR])
        shared = sizes.pop(OBJECTS_DIR)
        return {r: sizes[rank_group_name(r)] for r in self.ranks}, shared, total

    def unlisted_rank_folders(self) -> list[str]:
        """Rank folders of a local store that are no readable rank group (zarr skips a folder
        without metadata: a half-written store), by name; none for a URL (no folders to look at)."""
        if not os.path.isdir(self.path):
            return []
        ranks = set(self.ranks)
        on_disk = sorted(n for n in os.listdir(self.path) if n.startswith(RANK_PREFIX))
        return [n for n in on_disk if n[len(RANK_PREFIX):].isdigit() and int(n[len(RANK_PREFIX):]) not in ranks]

    @cached_property
    def _views(self) -> dict[int, RankView]:
        return {r: RankView(self, r, g) for r, g in self._rank_groups.items()}

    def rank(self, rank: int) -> RankView:
        try:
            return self._views[rank]
        except KeyError:
            raise StoreError(f"{self.path} has no rank {rank}") from None

    @property
    def run(self) -> dict:
        """Run-level facts: the root metadata merged over what rank 0 (or the lowest rank) reported."""
        info = {}
        if self.ranks:
            info.update(self.rank(self.ranks[0]).attrs.get("run", {}))
        info.update({k: v for k, v in self.meta.items() if v is not None})
        return info

    @property
    def setup(self) -> RunSetup:
        """What the run computed on (device, backend, mode, dtype), typed, from `run`."""
        return RunSetup.from_attrs(self.run)

    def run_facts(self) -> dict:
        """The run's facts, flat: `run` without the launcher's per-rank completion table (`ranks`,
        shown per rank instead) and with the root's own `run` entries where the rest lacks them."""
        info = {k: v for k, v in self.run.items() if k not in ("ranks", "run")}
        for k, v in self.run_meta.run.items():
            info.setdefault(k, v)
        return info

    @cached_property
    def run_meta(self) -> RunMeta:
        """The root metadata, typed (tracekit/store/runmeta.py): command, versions, exit status, ..."""
        try:
            return RunMeta.from_attrs(self.meta)
        except (TypeError, ValueError) as e:
            raise StoreError(f"{self.path}: malformed root metadata ({e}; damaged store?)") from None

    @cached_property
    def io_root(self):
        """What tracekit/store/io.py reads objects under: the ByteStore of the folder (as the user gave
        it: messages name it) or of the URL's Location."""
        return io.byte_store(self.path if self.location.is_local else self.location)

    def ensure_verified(self, digest: bytes, info: "TensorInfo", where: str, loc: Located) -> bool:
        """Check the bytes at `loc` against their hash `digest` once per open store; StoreError
        (damage) if they differ. Returns whether all its elements are finite."""
        finite = self.verified.get(digest, loc)
        if finite is not None:
            return finite
        with self._verify_lock:  # one reader per object: threads naming the same object wait for it
            lock = self._object_locks.setdefault((digest, loc), threading.Lock())
        with lock:
            finite = self.verified.get(digest, loc)
            if finite is None:
                # local files: a small reused buffer; an object store: FILE_PIECE-sized ranged GETs
                problem, finite = _objects.scan_object(self.io_root, digest, info, scan_buffer() if self.location.is_local else None, loc)
                if problem is not None:
                    raise damaged(where, problem)
                self.verified.add(digest, loc, finite)
        return finite

    @property
    def finished(self) -> bool:
        """True once the launcher finalized the store (end time and exit status known)."""
        return "exit_status" in self.meta

    @property
    def job_state(self) -> str:
        """'finished' (finalized), 'recording' (its launcher still holds the store), 'launcher died'
        (a `tracekit record` job ended without finalizing), or 'no launcher' (written by Recorders alone)."""
        from tracekit.store.ownership import job_alive

        if self.finished:
            return "finished"
        if self.meta.get("launcher") != "tracekit record":
            return "no launcher"
        if self.meta.get("writers_outlived_launcher"):
            return "launcher died"
        if not self.location.is_local:
            return "unfinished"  # object stores hold no locks: a live job and a dead one look alike
        return "recording" if job_alive(self.location.path) else "launcher died"

    def __repr__(self) -> str:
        return f"RunStore({self.path!r}, ranks={self.ranks})"


def open_store(path, storage_options=None, share_with: RunStore | None = None) -> RunStore:
    """Open a tracekit store (a folder or a URL such as s3://bucket/runs/ref) read-only; raises
    StoreError (one readable line) if it is not one. `storage_options`: fsspec options for URLs.
    `share_with`: an open store whose parsed tensor indexes this one may reuse where its own are
    equal (the other side of a comparison), and its parsed `zarr.json` files where the bytes are equal."""
    return RunStore(path, storage_options, share_with)
