"""Reading a store: ranks, their coordinates, completed steps, and tensors by name.

Only rows listed in a kind's `steps` and steps listed in a rank's `completed_steps` are visible,
so a store left behind by a crash reads as exactly the steps that were fully written.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import zarr

from tracekit.dtypes import to_numpy_values
from tracekit.errors import StoreError
from tracekit.store.chunks import check_size_claims, chunk_cols, first_missing_chunk, irregular_metadata
from tracekit.store.format import FORMAT_VERSION, MAX_STEP, RANK_PREFIX, ROOT_KEY, kind_order
from tracekit.store.location import Location, resolve


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dtype: str  # logical dtype: float32, bfloat16, ...
    shape: tuple[int, ...]
    array: str  # packed array holding it
    offset: int
    numel: int

    @property
    def nbytes(self) -> int:
        from tracekit.dtypes import storage_dtype

        return self.numel * storage_dtype(self.dtype).itemsize


def _read_root_attrs(path: str, location: Location) -> dict:
    if location.is_local:
        if not os.path.exists(path):
            raise StoreError(f"{path}: no such store")
        if not os.path.isdir(path):
            raise StoreError(f"{path} is not a directory, so not a tracekit store")
        meta_file = os.path.join(location.path, "zarr.json")
        if os.path.lexists(meta_file) and not os.path.isfile(meta_file):  # a FIFO would block the read forever
            raise StoreError(f"{path}: its zarr.json is not a regular file (damaged store?)")
    raw = location.read_bytes("zarr.json")
    if raw is None:
        if not location.is_local and location.is_empty():
            raise StoreError(f"{path}: no such store")
        raise StoreError(f"{path} is not a tracekit store (no zarr.json at its root)")
    try:
        doc = json.loads(raw)
    except ValueError as e:
        raise StoreError(f"{path}: unreadable root metadata ({e.__class__.__name__})") from None
    attrs = doc.get("attributes", {}) if isinstance(doc, dict) else {}
    if not isinstance(attrs, dict) or ROOT_KEY not in attrs:
        raise StoreError(f"{path} is a zarr store but not a tracekit store (no '{ROOT_KEY}' metadata)")
    meta = attrs[ROOT_KEY]
    if not isinstance(meta, dict):
        raise StoreError(f"{path}: the '{ROOT_KEY}' metadata is not an object (damaged store?)")
    _check_types(meta, _ROOT_TYPES, f"{path}: root")
    version = meta.get("format_version")
    if not isinstance(version, int):
        raise StoreError(f"{path}: tracekit metadata has no format version (half-written store?)")
    if version > FORMAT_VERSION:
        raise StoreError(
            f"{path} has store format {version}, newer than this tracekit reads ({FORMAT_VERSION}); upgrade tracekit"
        )
    return meta


# Metadata fields readers use as containers: a damaged or hostile value of another type is one
# StoreError here, not an AttributeError wherever it is first used.
_ROOT_TYPES = {"run": dict, "ranks": dict, "record_config": dict, "command": list, "world_size": (int, type(None))}
_RANK_TYPES = {"run": dict, "coords": dict, "completed_steps": list, "status": str, "fallback_ops": list,
               "env": dict, "versions": dict, "config": dict}


def _check_types(attrs: dict, types: dict, where: str) -> None:
    for key, kind in types.items():
        if key in attrs and not isinstance(attrs[key], kind):
            raise StoreError(f"{where} metadata: {key!r} is a {type(attrs[key]).__name__} (damaged store?)")


def _members(group: zarr.Group, where: str) -> list:
    """A group's children; damaged child metadata is a StoreError naming the place, not a zarr traceback."""
    odd = irregular_metadata(group)
    if odd is not None:
        raise StoreError(f"{where}: {odd} is not a regular file (damaged store?)")
    try:
        return list(group.members())
    except Exception as e:
        raise StoreError(f"{where}: unreadable metadata below it ({e.__class__.__name__}: {e})") from None


def _step_list(value, where: str) -> list[int]:
    if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        raise StoreError(f"{where}: malformed step list in its metadata (damaged store?)")
    bad = next((v for v in value if not 0 <= v <= MAX_STEP), None)
    if bad is not None:
        raise StoreError(f"{where}: impossible step {bad} in its metadata (damaged store?)")
    return value


def _tensor_info(entry: dict) -> TensorInfo:
    """One entry of a kind's tensor index, checked (a dtype tracekit cannot store is damage too)."""
    from tracekit.dtypes import storage_dtype

    def integer(v):
        if not isinstance(v, int) or isinstance(v, bool):
            raise ValueError(f"{v!r} is not an integer")
        return v

    if not isinstance(entry["name"], str) or not isinstance(entry["array"], str) or not isinstance(entry["shape"], list):
        raise ValueError("name, array and shape must be two strings and a list")
    info = TensorInfo(entry["name"], str(entry["dtype"]), tuple(integer(d) for d in entry["shape"]),
                      entry["array"], integer(entry["offset"]), integer(entry["numel"]))
    storage_dtype(info.dtype)  # raises ValueError for an unknown dtype
    if any(d < 0 for d in info.shape) or info.offset < 0 or info.numel != math.prod(info.shape):
        raise ValueError(f"tensor {info.name!r}: offset/numel do not match its shape")
    return info


class RankView:
    """One rank's recorded data."""

    def __init__(self, store: "RunStore", rank: int, group: zarr.Group):
        self.store = store
        self.rank = rank
        self.group = group
        self.attrs = dict(group.attrs)
        _check_types(self.attrs, _RANK_TYPES, f"{store.path}: rank {rank}")

    @property
    def coords(self) -> dict:
        coords = self.attrs.get("coords", {"rank": self.rank})
        if not isinstance(coords, dict):
            raise StoreError(f"{self.store.path}: rank {self.rank} has malformed coordinates (damaged metadata)")
        return coords

    @property
    def completed_steps(self) -> list[int]:
        return sorted(_step_list(self.attrs.get("completed_steps", []), f"{self.store.path}: rank {self.rank}"))

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

    @property
    def exit_code(self) -> int | None:
        """The rank's exit code as its launcher saw it (negative: a signal), where known."""
        return self._final.get("exit_code")

    @cached_property
    def _kind_groups(self) -> dict[str, zarr.Group]:
        groups = {}
        for name, node in _members(self.group, f"{self.store.path}: rank {self.rank}"):
            if isinstance(node, zarr.Group) and "tensors" in node.attrs:
                groups[name] = node
        return groups

    @property
    def kinds(self) -> list[str]:
        return sorted(self._kind_groups, key=lambda k: (kind_order(k), k))

    def _kind(self, kind: str) -> zarr.Group:
        try:
            return self._kind_groups[kind]
        except KeyError:
            raise StoreError(f"rank {self.rank} has no {kind!r} data") from None

    @cached_property
    def _index(self) -> dict[str, dict[str, TensorInfo]]:
        out = {}
        for kind, g in self._kind_groups.items():
            try:
                infos = [_tensor_info(e) for e in g.attrs["tensors"]]
            except (TypeError, KeyError, ValueError, OverflowError) as e:
                raise StoreError(f"{self.store.path}: rank {self.rank} {kind}: malformed tensor index "
                                 f"({e.__class__.__name__}: {e})") from None
            out[kind] = {info.name: info for info in infos}
        return out

    def tensors(self, kind: str) -> list[TensorInfo]:
        self._kind(kind)
        return list(self._index[kind].values())

    def tensor(self, kind: str, name: str) -> TensorInfo:
        try:
            return self._index[kind][name]
        except KeyError:
            raise StoreError(f"rank {self.rank} has no {kind} tensor {name!r}") from None

    def steps(self, kind: str) -> list[int]:
        """Steps for which `kind` holds data and the step was completed (step 0: initial parameters)."""
        rows = self._rows(kind)
        done = set(self.completed_steps) | {0}
        return [s for s in rows if s in done]

    def _rows(self, kind: str) -> list[int]:
        return _step_list(self._kind(kind).attrs.get("steps", []), f"{self.store.path}: rank {self.rank} {kind}")

    def _row(self, kind: str, step: int) -> int:
        rows = self._rows(kind)
        if step not in self.steps(kind):
            raise StoreError(f"rank {self.rank} has no {kind} data for step {step}")
        return rows.index(step)

    def array(self, kind: str, key: str) -> zarr.Array:
        """A packed array, opened once, its size claims checked against the files (StoreError if they lie)."""
        cache = self.__dict__.setdefault("_arrays", {})
        if (kind, key) not in cache:
            where = f"{self.store.path}: rank {self.rank} {kind}/{key}"
            odd = irregular_metadata(self._kind(kind), [key])
            if odd is not None:
                raise StoreError(f"{where}: {odd} is not a regular file (damaged store?)")
            try:
                arr = self._kind(kind)[key]
            except StoreError:
                raise
            except Exception as e:  # damaged array metadata (bad JSON, bad codec): one line
                raise StoreError(f"{where}: unreadable array metadata ({e.__class__.__name__}: {e})") from None
            if not isinstance(arr, zarr.Array):
                raise StoreError(f"{where}: is not an array (damaged store?)")
            extents = [(i.name, i.offset, i.numel) for i in self.tensors(kind) if i.array == key]
            problem = check_size_claims(arr, len(self._rows(kind)), extents)
            if problem:
                raise StoreError(f"{where}: damaged metadata: it {problem}")
            cache[(kind, key)] = arr
        return cache[(kind, key)]

    def _require_chunks(self, kind: str, key: str, row: int, start: int, stop: int) -> None:
        """zarr 3.1 silently returns fill values for a missing chunk; a store must never do that."""
        array = self.array(kind, key)
        missing = first_missing_chunk(array, [row], chunk_cols(start, stop, array.chunks[1]))
        if missing is not None:
            raise FileNotFoundError(f"chunk c/{missing[0]}/{missing[1]} of {key} is missing")

    def _read_row(self, kind: str, step: int, key: str, start: int, stop: int) -> np.ndarray:
        row = self._row(kind, step)
        try:
            self._require_chunks(kind, key, row, start, stop)
            return self.array(kind, key)[row, start:stop]
        except Exception as e:  # a missing or corrupt chunk must surface as one line, not a zarr traceback
            raise StoreError(
                f"{self.store.path}: rank {self.rank} {kind} step {step}: unreadable data ({e.__class__.__name__}: {e})"
            ) from None

    def read_bits(self, kind: str, step: int, name: str, start: int = 0, stop: int | None = None) -> np.ndarray:
        """A tensor's stored data, flat, in storage dtype (bfloat16 as uint16 bits); a slice of it with start/stop."""
        info = self.tensor(kind, name)
        stop = info.numel if stop is None else min(stop, info.numel)
        return self._read_row(kind, step, info.array, info.offset + start, info.offset + stop)

    def read(self, kind: str, step: int, name: str) -> np.ndarray:
        """A tensor as numpy values in its shape (bfloat16 widened exactly to float32)."""
        info = self.tensor(kind, name)
        return to_numpy_values(self.read_bits(kind, step, name), info.dtype).reshape(info.shape)

    def read_kind(self, kind: str, step: int) -> dict[str, np.ndarray]:
        """Every tensor of a kind at a step, reading each packed row once."""
        rows = {}
        out = {}
        for info in self.tensors(kind):
            if info.array not in rows:
                rows[info.array] = self._read_row(kind, step, info.array, 0, self.array(kind, info.array).shape[1])
            bits = rows[info.array][info.offset : info.offset + info.numel]
            out[info.name] = to_numpy_values(bits, info.dtype).reshape(info.shape)
        return out


class RunStore:
    """A recorded run, opened read-only."""

    def __init__(self, path, storage_options=None):
        self.location = resolve(path, storage_options)
        # as given for local folders (messages name what the user typed), the URL otherwise
        self.path = os.fspath(path) if self.location.is_local and not isinstance(path, Location) else str(self.location)
        self.meta = _read_root_attrs(self.path, self.location)
        try:
            self.root = zarr.open_group(self.location.zarr_store(read_only=True), mode="r", use_consolidated=False)
        except Exception as e:
            raise StoreError(f"{self.path}: cannot open as zarr ({e.__class__.__name__}: {e})") from None

    @cached_property
    def _rank_groups(self) -> dict[int, zarr.Group]:
        out = {}
        for name, node in _members(self.root, self.path):
            if name.startswith(RANK_PREFIX) and isinstance(node, zarr.Group):
                try:
                    out[int(name[len(RANK_PREFIX) :])] = node
                except ValueError:
                    continue
        return dict(sorted(out.items()))

    @property
    def ranks(self) -> list[int]:
        return list(self._rank_groups)

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


def open_store(path, storage_options=None) -> RunStore:
    """Open a tracekit store (a folder or a URL such as s3://bucket/runs/ref) read-only; raises
    StoreError (one readable line) if it is not one. `storage_options`: fsspec options for URLs."""
    return RunStore(path, storage_options)
