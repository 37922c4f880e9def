"""The xarray backend `engine="tracekit"`: a store as a DataTree, one node per kind (docs/INSPECT.md).

    xr.open_datatree("runs/ref", engine="tracekit")
    xr.open_dataset("runs/ref", engine="tracekit", group="gradients")

Registered through the `xarray.backends` entry point (pyproject.toml). Variables are lazy
BackendArrays (tracekit/inspect/backend_array.py) that read through the store's logical API;
xarray's `chunks=` makes them dask arrays (one chunk per rank and step) when dask is installed.
`tracekit.open` is this backend with chunks chosen for you (tracekit/inspect/opener.py).
"""

from __future__ import annotations

import os

import numpy as np
import xarray as xr
from xarray.backends import BackendEntrypoint
from xarray.core import indexing

from tracekit.errors import StoreError, UsageError
from tracekit.inspect.backend_array import TensorArray
from tracekit.inspect.coords import rank_columns
from tracekit.inspect.summary import run_metadata
from tracekit.store import RunStore, open_store
from tracekit.store.kinds import kind_order
from tracekit.store.location import canonical
from tracekit.store.spans import TensorSteps


class OpenedStore:
    """A store opened for one xarray open. Its dask token is unique to this open, so two opens of
    one path (say before and after the store was rewritten) never share a graph key."""

    def __init__(self, store: RunStore):
        self.store = store
        self._token = os.urandom(16).hex()

    def __dask_tokenize__(self):
        return self._token


def _store(source) -> RunStore:
    if isinstance(source, OpenedStore):
        return source.store
    return source if isinstance(source, RunStore) else open_store(source)


def variable_name(name: str) -> str:
    """A tensor's xarray variable name: '/' (legal in torch module names, not in a DataTree) becomes %2F."""
    return name.replace("/", "%2F")


def tensor_dims(name: str, ndim: int) -> tuple[str, ...]:
    """A tensor's own dims, named after it so tensors of different shapes share one Dataset."""
    return tuple(f"{name}_dim{i}" for i in range(ndim))


def _lazy(dims: tuple[str, ...], array: TensorArray, attrs: dict) -> xr.Variable:
    return xr.Variable(dims, indexing.LazilyIndexedArray(array), attrs=attrs,
                       encoding={"preferred_chunks": array.preferred_chunks(dims)})


def rank_coords_of(store) -> tuple[dict, dict]:
    """(coords along rank, run-wide attrs): the rank index plus dp_rank, tp_rank, mesh positions, ..."""
    columns, attrs = rank_columns({r: store.rank(r).meta.coords for r in store.ranks})
    coords = {"rank": np.asarray(store.ranks, dtype=np.int64)}
    try:
        coords.update({k: ("rank", np.asarray(v, dtype=np.int64)) for k, v in columns.items()})
    except (OverflowError, TypeError, ValueError) as e:
        raise StoreError(f"{store.path}: rank coordinates that are not integers ({e}); damaged metadata") from None
    return coords, attrs


def _kind_dataset(store, kind: str, rank_coords: dict) -> xr.Dataset:
    ranks = store.ranks
    steps_of = {r: store.rank(r).steps(kind) if kind in store.rank(r).kinds else [] for r in ranks}
    steps = sorted(set().union(*steps_of.values())) if steps_of else []
    infos: dict[str, dict[int, object]] = {}  # name -> {rank: TensorInfo}, in first-seen order
    for r in ranks:
        view = store.rank(r)
        if kind in view.kinds:
            for info in view.tensors(kind):
                infos.setdefault(info.name, {})[r] = info
    data_vars = {}
    seen: dict[str, str] = {}
    for tensor, by_rank in infos.items():
        name = variable_name(tensor)
        if seen.setdefault(name, tensor) != tensor:
            raise StoreError(f"{store.path}: {kind} tensors {seen[name]!r} and {tensor!r} have the same variable name {name!r}")
        sources = {r: TensorSteps(store.rank(r), kind, tensor) for r in by_rank}
        shapes = {i.shape for i in by_rank.values()}
        dtypes = sorted({i.dtype for i in by_rank.values()})
        attrs = {"kind": kind, "tensor": tensor, "recorded_dtype": dtypes[0] if len(dtypes) == 1 else dtypes}
        if len(shapes) == 1:
            template = next(iter(by_rank.values()))
            array = TensorArray([sources.get(r) for r in ranks], steps, template.shape, template.dtype)
            dims = ("rank", "step", *tensor_dims(name, len(template.shape)))
            data_vars[name] = _lazy(dims, array, {**attrs, "shape": list(template.shape)})
        else:
            # Shapes differ over ranks (a layout that records local shards): nothing to stack, so
            # each rank gets its own variable `name@rankR` over (step, its own dims).
            for r, info in by_rank.items():
                vname = f"{name}@rank{r}"
                array = TensorArray([sources[r]], steps, info.shape, info.dtype, per_rank=True)
                dims = ("step", *tensor_dims(vname, len(info.shape)))
                data_vars[vname] = _lazy(dims, array, {**attrs, "shape": list(info.shape), "rank": r})
    recorded = np.array([[s in set(steps_of[r]) for s in steps] for r in ranks], dtype=bool).reshape(len(ranks), len(steps))
    # DataTree children inherit only indexed coords, so each kind carries dp_rank & co. itself.
    coords = {**rank_coords, "step": np.asarray(steps, dtype=np.int64), "recorded": (("rank", "step"), recorded)}
    return xr.Dataset(data_vars, coords=coords, attrs={"kind": kind})


def _root_dataset(store, coords: dict, coord_attrs: dict) -> xr.Dataset:
    views = [store.rank(r) for r in store.ranks]
    data_vars = {
        "status": ("rank", np.asarray([v.status for v in views], dtype=object)),
        "steps_completed": ("rank", np.asarray([len(v.completed_steps) for v in views], dtype=np.int64)),
        "last_step": ("rank", np.asarray([max(v.completed_steps, default=-1) for v in views], dtype=np.int64)),
    }
    attrs = {"store": canonical(store.path), **coord_attrs, **run_metadata(store)}
    return xr.Dataset(data_vars, coords=coords, attrs=attrs)


def _kinds(store, kinds) -> list[str]:
    """The store's kinds in compute order, or those of `kinds` (UsageError naming any it lacks)."""
    all_kinds = sorted({k for r in store.ranks for k in store.rank(r).kinds}, key=lambda k: (kind_order(k), k))
    if kinds is None:
        return all_kinds
    wanted = [kinds] if isinstance(kinds, str) else list(kinds)
    unknown = [k for k in wanted if k not in all_kinds]
    if unknown:
        raise UsageError(f"{store.path} has no {', '.join(unknown)} data (it has: {', '.join(all_kinds) or 'none'})")
    return [k for k in all_kinds if k in wanted]


def _dropped(ds: xr.Dataset, drop_variables) -> xr.Dataset:
    if drop_variables is None:
        return ds
    names = [drop_variables] if isinstance(drop_variables, str) else list(drop_variables)
    return ds.drop_vars(names, errors="ignore")


class TracekitBackendEntrypoint(BackendEntrypoint):
    """xarray's `engine="tracekit"`: group "/" is the run (per-rank status, run metadata), and one
    group per kind ("gradients", ...) holds its tensors over (rank, step, <name>_dim0, ...)."""

    description = "tracekit run stores: one group per kind, one variable per tensor over (rank, step)"
    open_dataset_parameters = ("filename_or_obj", "drop_variables", "group", "kinds")
    supports_groups = True

    def guess_can_open(self, filename_or_obj) -> bool:
        if isinstance(filename_or_obj, (RunStore, OpenedStore)):
            return True
        try:
            path = os.fspath(filename_or_obj)
        except TypeError:
            return False
        if not isinstance(path, str) or not os.path.isdir(path):  # local folders only: a guess reads no network
            return False
        from tracekit.store import is_store

        try:
            return is_store(path)
        except Exception:  # unreadable: not ours to claim
            return False

    def open_groups_as_dict(self, filename_or_obj, *, drop_variables=None, kinds=None) -> dict[str, xr.Dataset]:
        store = _store(filename_or_obj)
        wanted = _kinds(store, kinds)
        coords, coord_attrs = rank_coords_of(store)
        groups = {"/": _root_dataset(store, coords, coord_attrs)}
        for kind in wanted:
            groups[f"/{kind}"] = _dropped(_kind_dataset(store, kind, coords), drop_variables)
        return groups

    def open_datatree(self, filename_or_obj, *, drop_variables=None, kinds=None) -> xr.DataTree:
        return xr.DataTree.from_dict(self.open_groups_as_dict(filename_or_obj, drop_variables=drop_variables, kinds=kinds))

    def open_dataset(self, filename_or_obj, *, drop_variables=None, group=None, kinds=None) -> xr.Dataset:
        store = _store(filename_or_obj)
        kind = (group or "/").strip("/")
        coords, coord_attrs = rank_coords_of(store)
        if not kind:
            return _root_dataset(store, coords, coord_attrs)
        if kinds is not None:
            raise UsageError("open_dataset opens one group: pass group=KIND, not kinds")
        return _dropped(_kind_dataset(store, _kinds(store, [kind])[0], coords), drop_variables)
