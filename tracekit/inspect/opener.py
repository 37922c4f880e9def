"""`tracekit.open`: a store as a lazy xarray DataTree (see docs/INSPECT.md for the layout)."""

from __future__ import annotations


import numpy as np

from tracekit.inspect.coords import rank_columns
from tracekit.inspect.lazy import packed_dask, require_dask, tensor_rows
from tracekit.inspect.summary import run_metadata
from tracekit.store import RunStore, open_store
from tracekit.store.location import canonical
from tracekit.store.kinds import kind_order


def variable_name(name: str) -> str:
    """A tensor's xarray variable name: '/' (legal in torch module names, not in a DataTree) becomes %2F."""
    return name.replace("/", "%2F")


def tensor_dims(name: str, ndim: int) -> tuple[str, ...]:
    """A tensor's own dims, named after it so tensors of different shapes share one Dataset."""
    return tuple(f"{name}_dim{i}" for i in range(ndim))


def _row_maps(store, kind: str) -> dict[int, dict[int, int]]:
    """{rank: {step: row}} for the rows of `kind` the reader considers visible (completed steps)."""
    out = {}
    for r in store.ranks:
        view = store.rank(r)
        if kind not in view.kinds:
            out[r] = {}
            continue
        out[r] = view.rows(kind)
    return out


def _rank_coords(store) -> tuple[dict, dict]:
    """(coords along rank, run-wide attrs): the rank index plus dp_rank, tp_rank, mesh positions, ..."""
    columns, attrs = rank_columns({r: store.rank(r).coords for r in store.ranks})
    coords = {"rank": np.asarray(store.ranks, dtype=np.int64)}
    try:
        coords.update({k: ("rank", np.asarray(v, dtype=np.int64)) for k, v in columns.items()})
    except (OverflowError, TypeError, ValueError) as e:
        from tracekit.errors import StoreError

        raise StoreError(f"{store.path}: rank coordinates that are not integers ({e}); damaged metadata") from None
    return coords, attrs


def _kind_dataset(store, kind: str, rank_coords: dict):
    import xarray as xr

    ranks = store.ranks
    row_maps = _row_maps(store, kind)
    steps = sorted(set().union(*row_maps.values())) if row_maps else []
    infos: dict[str, dict[int, object]] = {}  # name -> {rank: TensorInfo}, in first-seen order
    for r in ranks:
        view = store.rank(r)
        if kind in view.kinds:
            for info in view.tensors(kind):
                infos.setdefault(info.name, {})[r] = info
    packed: dict[tuple[int, str], object] = {}

    def packed_for(r, info):
        key = (r, info.array)
        if key not in packed:
            packed[key] = packed_dask(store.rank(r).array(kind, info.array), f"r{r}-{kind}-{info.array}",
                                      f"{store.path}: rank {r} {kind}/{info.array}")
        return packed[key]

    def rows_for(r):
        return [row_maps[r].get(s) for s in steps]

    data_vars = {}
    seen: dict[str, str] = {}
    for name, by_rank in infos.items():
        tensor = name
        name = variable_name(name)
        if seen.setdefault(name, tensor) != tensor:
            from tracekit.errors import StoreError

            raise StoreError(f"{store.path}: {kind} tensors {seen[name]!r} and {tensor!r} have the same variable name {name!r}")
        shapes = {i.shape for i in by_rank.values()}
        dtypes = sorted({i.dtype for i in by_rank.values()})
        attrs = {"kind": kind, "tensor": tensor, "recorded_dtype": dtypes[0] if len(dtypes) == 1 else dtypes}
        if len(shapes) == 1:
            template = next(iter(by_rank.values()))
            per_rank = []
            for r in ranks:
                info = by_rank.get(r)
                if info is None:  # this rank lacks the tensor: all-NaN rows of the common shape
                    per_rank.append(tensor_rows(None, template, [None] * len(steps)))
                else:
                    per_rank.append(tensor_rows(packed_for(r, info), info, rows_for(r)))
            dtype = np.result_type(*[p.dtype for p in per_rank])
            stacked = require_dask().stack([p.astype(dtype, copy=False) for p in per_rank], axis=0)
            dims = ("rank", "step", *tensor_dims(name, len(template.shape)))
            data_vars[name] = xr.Variable(dims, stacked, attrs={**attrs, "shape": list(template.shape)})
        else:
            # Shapes differ over ranks (a layout that records local shards): nothing to stack, so
            # each rank gets its own variable `name@rankR` over (step, its own dims).
            for r, info in by_rank.items():
                vname = f"{name}@rank{r}"
                dims = ("step", *tensor_dims(vname, len(info.shape)))
                data = tensor_rows(packed_for(r, info), info, rows_for(r))
                data_vars[vname] = xr.Variable(dims, data, attrs={**attrs, "shape": list(info.shape), "rank": r})
    recorded = np.array([[s in row_maps[r] for s in steps] for r in ranks], dtype=bool).reshape(len(ranks), len(steps))
    # DataTree children inherit only indexed coords, so each kind carries dp_rank & co. itself.
    coords = {**rank_coords, "step": np.asarray(steps, dtype=np.int64), "recorded": (("rank", "step"), recorded)}
    return xr.Dataset(data_vars, coords=coords, attrs={"kind": kind})


def _root_dataset(store, coords: dict, coord_attrs: dict):
    import xarray as xr

    views = [store.rank(r) for r in store.ranks]
    data_vars = {
        "status": ("rank", np.asarray([v.status for v in views], dtype=object)),
        "steps_completed": ("rank", np.asarray([len(v.completed_steps) for v in views], dtype=np.int64)),
        "last_step": ("rank", np.asarray([max(v.completed_steps, default=-1) for v in views], dtype=np.int64)),
    }
    attrs = {"store": canonical(store.path), **coord_attrs, **run_metadata(store)}
    return xr.Dataset(data_vars, coords=coords, attrs=attrs)


def open_tree(path, kinds=None):
    """Open a store as an xarray DataTree, lazily: only metadata is read until values are computed.

    Root node: coords `rank` and, along it, dp_rank, tp_rank, local_rank and mesh positions;
    per-rank `status`, `steps_completed`, `last_step`; the run metadata in attrs.
    One child node per kind (`tree["gradients"]`) whose variables are the tensors under their
    own names, dims (rank, step, <name>_dim0, ...), dask-backed, bfloat16 decoded to float32.
    Steps are the union over ranks; a rank without a step reads NaN there (see coord `recorded`).
    A tensor whose shape differs over ranks is split into `name@rankR` variables over (step, ...).
    """
    import xarray as xr

    require_dask()
    store = path if isinstance(path, RunStore) else open_store(path)
    all_kinds = sorted({k for r in store.ranks for k in store.rank(r).kinds}, key=lambda k: (kind_order(k), k))
    if kinds is not None:
        wanted = [kinds] if isinstance(kinds, str) else list(kinds)
        unknown = [k for k in wanted if k not in all_kinds]
        if unknown:
            from tracekit.errors import UsageError

            raise UsageError(f"{path} has no {', '.join(unknown)} data (it has: {', '.join(all_kinds) or 'none'})")
        all_kinds = [k for k in all_kinds if k in wanted]
    coords, coord_attrs = _rank_coords(store)
    nodes = {"/": _root_dataset(store, coords, coord_attrs)}
    for kind in all_kinds:
        nodes[kind] = _kind_dataset(store, kind, coords)
    return xr.DataTree.from_dict(nodes)
