"""`tracekit.open_diff`: the metrics of `tracekit diff` as an xarray Dataset, plus lazy errors.

The metrics are not recomputed here: they are the diff engine's own results (tracekit.compare.diff
with details="all"), laid out over (rank, step, tensor), so the Dataset and `tracekit diff` agree
by construction. The elementwise errors are lazy arrays over the two stores (tracekit.open).
"""

from __future__ import annotations

import numpy as np

from tracekit.errors import StoreError
from tracekit.store.kinds import kind_order

# Metrics of each (rank, step, tensor), as TensorMetrics attributes; NaN where nothing was compared.
METRICS = ("max_abs_err", "max_rel_err", "rel_l2_err", "cosine", "violation_fraction")
COUNTS = ("violations", "nonfinite", "numel")
WORST = ("ref", "cand", "abs_err")


def tensor_key(kind: str, name: str) -> str:
    """The `tensor` coordinate of a diff: 'gradients/0.weight'."""
    return f"{kind}/{name}"


def error_var(key: str) -> str:
    """Name of the lazy |cand - ref| variable of a tensor: 'abs_err/gradients/0.weight'."""
    return f"abs_err/{key}"


def error_dims(key: str, ndim: int) -> tuple[str, ...]:
    return tuple(f"{key}_dim{i}" for i in range(ndim))


def _report_attrs(report, ref, cand, diff_kwargs) -> dict:
    fd = report.first_divergence
    return {
        "verdict": report.status.upper(),
        "summary_line": report.summary_line,
        "ref": str(ref), "cand": str(cand),
        "align": report.align,
        "options": report.options,
        "diff_kwargs": diff_kwargs,
        "tolerances": report.tolerances,
        "first_divergence": fd.to_dict() if fd is not None else None,
        "root_cause": rc.to_dict() if (rc := report.root_cause) is not None else None,
        # under a passing verdict: the first difference the traces show (never a root cause)
        "trace_difference": td.to_dict() if (td := report.trace_difference) is not None else None,
        # per (rank, step, level) both stores traced: alignment counts and each event's status
        "traces": [{**t.to_dict(), "events": t.events} for t in report.traces],
    }


def _metrics_dataset(report, keys, ranks, steps):
    import xarray as xr

    ri = {r: i for i, r in enumerate(ranks)}
    si = {s: i for i, s in enumerate(steps)}
    ki = {k: i for i, k in enumerate(keys)}
    shape = (len(ranks), len(steps), len(keys))
    floats = {m: np.full(shape, np.nan) for m in METRICS + COUNTS}
    worst = {w: np.full(shape, np.nan) for w in WORST}
    worst_flat = np.full(shape, -1, dtype=np.int64)
    ref_rank = np.full(shape, -1, dtype=np.int64)
    passed = np.zeros(shape, dtype=bool)
    margin = np.full(shape, np.nan)  # error over bound of the rule closer to failing; > 1 fails
    for r in report.results:
        at = (ri[r.rank], si[r.step], ki[tensor_key(r.kind, r.tensor)])
        m = r.metrics
        for name in METRICS + COUNTS:
            v = getattr(m, name)
            floats[name][at] = np.nan if v is None else v  # None: no comparable element
        ref_rank[at] = r.ref_rank
        passed[at] = m.passed  # the elementwise and the norm rule
        margin[at] = np.nan if m.margin is None else m.margin
        if m.worst is not None:
            worst["ref"][at], worst["cand"][at], worst["abs_err"][at] = m.worst.ref, m.worst.cand, m.worst.abs_err
            worst_flat[at] = int(np.ravel_multi_index(m.worst.index, r.shape)) if r.shape else 0
    dims = ("rank", "step", "tensor")
    compared = ~np.isnan(floats["numel"])
    data = {name: (dims, arr) for name, arr in floats.items()}
    data.update({f"worst_{w}": (dims, arr) for w, arr in worst.items()})
    data["worst_flat_index"] = (dims, worst_flat)
    data["ref_rank"] = (dims, ref_rank)
    data["compared"] = (dims, compared)
    data["passed"] = (dims, compared & passed)
    data["margin"] = (dims, margin)
    return xr.Dataset(data)


def open_diff(ref, cand, **diff_kwargs):
    """Compare REF and CAND with tracekit.compare.diff and return its results as an xarray Dataset.

    Dims rank (candidate ranks), step and tensor ('kind/name'); per (rank, step, tensor) the diff's
    metrics (max_abs_err, max_rel_err, rel_l2_err, cosine, violation_fraction, violations,
    nonfinite, numel), `margin` (error over bound of the closer rule, elementwise or norm: > 1
    fails; inf for a NaN/Inf mismatch), its worst element (worst_ref, worst_cand, worst_abs_err, worst_flat_index),
    `compared` and `passed`; NaN where a pair was not compared. Per tensor, coords kind, name,
    dtype, shape, rtol, atol (the tolerance the diff applied). Per tensor also a lazy data variable
    `abs_err/<kind>/<name>` = |cand - ref| over (rank, step, '<kind>/<name>_dim0', ...).
    diff_kwargs go to tracekit.compare.diff (rtol, atol, tol, align, kinds, ...); the verdict,
    first divergence and options are in attrs; `ds.tracekit` (see accessor) answers the common
    questions.
    """
    from tracekit.compare import diff

    diff_kwargs = {k: v for k, v in diff_kwargs.items() if k not in ("details", "progress")}
    ref, cand = _opened(ref), _opened(cand)  # each store opened once, for the diff and the views
    report = diff(ref, cand, details="all", **diff_kwargs)
    return dataset_from_report(report, ref, cand, diff_kwargs)


def _opened(store):
    from tracekit.store import RunStore, open_store

    return store if isinstance(store, RunStore) else open_store(store)


def dataset_from_report(report, ref, cand, diff_kwargs=None, elementwise: bool = True):
    """The open_diff Dataset of a DiffReport computed with details="all" (see open_diff).

    ref, cand: paths or opened RunStores (opened ones are not opened again). elementwise=False
    leaves out the lazy `abs_err/...` variables: the metrics alone need neither dask nor a view
    of the tensors (the HTML report uses only them)."""
    from tracekit.inspect import accessor  # noqa: F401 - registers ds.tracekit
    from tracekit.inspect.backend import rank_coords_of

    if not report.usable:
        problems = "; ".join(p.message for p in report.structural[:3])
        more = f" (and {len(report.structural) - 3} more)" if len(report.structural) > 3 else ""
        raise StoreError(f"the stores differ in structure: {problems}{more}; pass allow_missing=True to compare the common part")
    if report.options.get("details") != "all":
        raise ValueError("dataset_from_report needs a report computed with details='all'")

    ref, cand = _opened(ref), _opened(cand)
    ranks = sorted({r.rank for r in report.results}) or list(report.ranks)
    steps = sorted(set(report.steps))
    per_tensor: dict[str, object] = {}  # key -> a TensorResult (dtype, shape)
    for r in sorted(report.results, key=lambda r: (kind_order(r.kind), r.kind)):
        per_tensor.setdefault(tensor_key(r.kind, r.tensor), r)
    keys = list(per_tensor)
    ds = _metrics_dataset(report, keys, ranks, steps)

    tol = {(t["kind"], t["dtype"]): t for t in report.tolerances}
    kinds = [per_tensor[k].kind for k in keys]
    ds = ds.assign_coords(
        rank=np.asarray(ranks, dtype=np.int64), step=np.asarray(steps, dtype=np.int64), tensor=np.asarray(keys, dtype=object),
        kind=("tensor", np.asarray(kinds, dtype=object)),
        name=("tensor", np.asarray([per_tensor[k].tensor for k in keys], dtype=object)),
        dtype=("tensor", np.asarray([per_tensor[k].dtype for k in keys], dtype=object)),
        shape=("tensor", np.asarray(["x".join(map(str, per_tensor[k].shape)) or "scalar" for k in keys], dtype=object)),
        rtol=("tensor", np.asarray([tol[(k_, per_tensor[k].dtype)]["rtol"] for k, k_ in zip(keys, kinds)])),
        atol=("tensor", np.asarray([tol[(k_, per_tensor[k].dtype)]["atol"] for k, k_ in zip(keys, kinds)])),
    )
    # rank coordinates of the candidate (dp_rank, tp_rank, mesh positions)
    cand_coords, _ = rank_coords_of(cand)
    position = {int(r): i for i, r in enumerate(cand_coords["rank"])}
    for c, value in cand_coords.items():
        if c != "rank":
            ds = ds.assign_coords({c: ("rank", np.asarray(value[1])[[position[r] for r in ranks]])})
    ds.attrs = _report_attrs(report, ref.path, cand.path, diff_kwargs or {})
    if not elementwise:
        return ds

    from tracekit.inspect.elementwise import abs_err
    from tracekit.inspect.opener import open_tree

    ref_tree, cand_tree = open_tree(ref), open_tree(cand)
    errors = {}
    for key in keys:
        r = per_tensor[key]
        if not (_stacked(ref_tree, r.kind, r.tensor) and _stacked(cand_tree, r.kind, r.tensor)):
            continue  # its shape differs over ranks: metrics only (see docs/INSPECT.md)
        ref_v, cand_v = _aligned(ref_tree, cand_tree, r.kind, r.tensor, ds["ref_rank"].sel(tensor=key), ranks, steps)
        dims = ("rank", "step", *error_dims(key, len(r.shape)))
        errors[error_var(key)] = abs_err(ref_v, cand_v).rename(dict(zip(ref_v.dims, dims))).drop_vars(
            [c for c in ref_v.coords if c not in ("rank", "step")], errors="ignore")
    attrs = ds.attrs
    ds = ds.assign(errors)
    ds.attrs = attrs
    return ds


def _stacked(tree, kind: str, name: str) -> bool:
    """Whether open() could stack the tensor over ranks (it splits it per rank when shapes differ)."""
    return kind in tree.children and name in tree[kind].data_vars


def _aligned(ref_tree, cand_tree, kind, name, ref_rank, ranks, steps):
    """(ref, cand) values of one tensor over (rank, step) of the diff: the reference taken from the
    rank the diff paired with each candidate rank (the same rank unless --align coords/global)."""
    cand = cand_tree[kind][name].reset_coords(drop=True).sel(rank=ranks).reindex(step=steps)
    ref_full = ref_tree[kind][name].reset_coords(drop=True).reindex(step=steps)
    # the paired ref rank of each candidate rank (any step that compared it)
    pairing = []
    for i, _r in enumerate(ranks):
        row = ref_rank.values[i]
        known = row[row >= 0]
        pairing.append(int(known[0]) if known.size else int(ranks[i]))
    ref = ref_full.reindex(rank=pairing).assign_coords(rank=ranks)
    return ref, cand
